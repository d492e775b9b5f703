/* The SDK's decision step for the disjoint linear policies (LinTS, LinUCB), compiled: one
 * call per decide instead of some twenty numpy calls of ~1 us fixed cost each.
 *
 * learner/policies/_linear.py keeps per arm a the factor F_a = [theta_a^T; L_a^T], a (d+1, d)
 * matrix, stacked for all arms in one C-contiguous float64 array (capacity, d+1, d). For the
 * K candidates, candidate k with arm slot s_k and row x_k:
 *
 *     r_k = F_{s_k} x_k        mean_k = r_k[0] = x_k . theta        width_k = ||r_k[1:]|| = ||L^T x_k||
 *
 * choose() then builds the policy's distribution and draws from it as the numpy path does
 * (learner/policies/base.py and the policy modules), with the same floating-point operations
 * from mean and width on, so equal inputs give equal probabilities and the same choice:
 *
 *   - Thompson (LinTS): n draws from the half = ceil(n / 2) rows of standard normals z the
 *     caller drew with numpy's Generator, in antithetic pairs: draw r < half scores
 *     mean + z[r] * scale, draw half + r scores mean - z[r] * scale, scale = v * width;
 *     p_k = (draws k wins) / n, the first maximum winning (numpy's argmax);
 *   - greedy (LinUCB): score = mean + alpha * width, the best scores share 1 evenly;
 *   - the floor, when eps0 > 0: p = p * (1 - eps0), then p + eps0 / K;
 *   - the draw with the caller's uniform u, base.draw_index's rule: for K <= 64 the first
 *     index of positive probability whose running sum exceeds u * fsum(p) (math.fsum's
 *     correctly rounded total), above 64 a running sum and a binary search; never an index
 *     of probability 0.
 *
 * mean and width differ from numpy's only in summation order. A row that is mostly zeros
 * (a hashed context) is summed over its nonzero terms alone; a dense one in pairs of doubles
 * (GCC/Clang vector extensions), four rows of F at a time.
 *
 * Also: repeated_row() builds the (K, d) candidate rows of a per-arm model (the context row,
 * K times; learner.features), all_finite() checks rows before scoring (learner.policies.base).
 * Python (numpy) stays the fallback for all of it when this module is not built.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

/* A C-contiguous buffer of `ndim` dimensions of one item type: 'd' (float64) or 'n' (intp). */
static int
get_array(PyObject *obj, Py_buffer *view, int ndim, char kind, int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    int ok = view->ndim == ndim && f[0] != '\0' && f[1] == '\0';
    if (ok && kind == 'd')
        ok = f[0] == 'd' && view->itemsize == sizeof(double);
    else if (ok)
        ok = strchr("lqn", f[0]) != NULL && view->itemsize == sizeof(Py_ssize_t);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous %d-d %s array", name, ndim,
                     kind == 'd' ? "float64" : "intp");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* f . x over the nonzero terms (idx, val) of x, in four interleaved partial sums */
static inline double
sparse_dot(const double *f, const Py_ssize_t *idx, const double *val, Py_ssize_t n)
{
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    Py_ssize_t t = 0;
    for (; t + 4 <= n; t += 4) {
        a0 += f[idx[t]] * val[t];
        a1 += f[idx[t + 1]] * val[t + 1];
        a2 += f[idx[t + 2]] * val[t + 2];
        a3 += f[idx[t + 3]] * val[t + 3];
    }
    for (; t < n; t++)
        a0 += f[idx[t]] * val[t];
    return (a0 + a1) + (a2 + a3);
}

/* Two doubles as one value (GCC and Clang vector extensions: one SSE2 or NEON register). */
typedef double v2 __attribute__((vector_size(16)));

static inline v2
load2(const double *p)
{
    v2 v;
    memcpy(&v, p, sizeof v); /* unaligned */
    return v;
}

/* f . x over all d terms, in four interleaved partial sums */
static inline double
dense_dot(const double *f, const double *x, Py_ssize_t d)
{
    v2 a = {0.0, 0.0}, b = a;
    Py_ssize_t i = 0;
    for (; i + 4 <= d; i += 4) {
        a += load2(f + i) * load2(x + i);
        b += load2(f + i + 2) * load2(x + i + 2);
    }
    double s = (a[0] + b[0]) + (a[1] + b[1]);
    for (; i < d; i++)
        s += f[i] * x[i];
    return s;
}

/* out[j] = f_j . x for the four consecutive rows f_j of f: dense_dot four times over, sharing
 * the loads of x, with eight independent chains in flight */
static inline void
dense_dot4(const double *f, const double *x, Py_ssize_t d, double *out)
{
    const double *f0 = f, *f1 = f + d, *f2 = f + 2 * d, *f3 = f + 3 * d;
    v2 a0 = {0.0, 0.0}, b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
    Py_ssize_t i = 0;
    for (; i + 4 <= d; i += 4) {
        v2 xa = load2(x + i), xb = load2(x + i + 2);
        a0 += load2(f0 + i) * xa;
        b0 += load2(f0 + i + 2) * xb;
        a1 += load2(f1 + i) * xa;
        b1 += load2(f1 + i + 2) * xb;
        a2 += load2(f2 + i) * xa;
        b2 += load2(f2 + i + 2) * xb;
        a3 += load2(f3 + i) * xa;
        b3 += load2(f3 + i + 2) * xb;
    }
    out[0] = (a0[0] + b0[0]) + (a0[1] + b0[1]);
    out[1] = (a1[0] + b1[0]) + (a1[1] + b1[1]);
    out[2] = (a2[0] + b2[0]) + (a2[1] + b2[1]);
    out[3] = (a3[0] + b3[0]) + (a3[1] + b3[1]);
    for (; i < d; i++) {
        out[0] += f0[i] * x[i];
        out[1] += f1[i] * x[i];
        out[2] += f2[i] * x[i];
        out[3] += f3[i] * x[i];
    }
}

/* The inputs of one scoring call, checked: factor (cap, d+1, d), slots (K,), X (K, d). */
typedef struct {
    Py_buffer F, slots, X;
    Py_ssize_t K, d;
} Inputs;

static void
release_inputs(Inputs *in)
{
    PyBuffer_Release(&in->F);
    PyBuffer_Release(&in->slots);
    PyBuffer_Release(&in->X);
}

static int
get_inputs(PyObject *F, PyObject *slots, PyObject *X, Inputs *in)
{
    if (get_array(F, &in->F, 3, 'd', 0, "factor") < 0)
        return -1;
    if (get_array(slots, &in->slots, 1, 'n', 0, "slots") < 0) {
        PyBuffer_Release(&in->F);
        return -1;
    }
    if (get_array(X, &in->X, 2, 'd', 0, "X") < 0) {
        PyBuffer_Release(&in->F);
        PyBuffer_Release(&in->slots);
        return -1;
    }
    Py_ssize_t cap = in->F.shape[0], d = in->F.shape[2];
    in->K = in->slots.shape[0];
    in->d = d;
    if (in->F.shape[1] != d + 1 || in->X.shape[0] != in->K || in->X.shape[1] != d || in->K < 1) {
        PyErr_SetString(PyExc_ValueError, "shapes must be factor (n, d+1, d), slots (K,), X (K, d) with K >= 1");
        release_inputs(in);
        return -1;
    }
    const Py_ssize_t *s = in->slots.buf;
    for (Py_ssize_t k = 0; k < in->K; k++) {
        if (s[k] < 0 || s[k] >= cap) {
            PyErr_Format(PyExc_IndexError, "slot %zd out of range for %zd arms", s[k], cap);
            release_inputs(in);
            return -1;
        }
    }
    return 0;
}

/* mean[k] = F_{s_k}[0] . x_k and width[k] = ||F_{s_k}[1:] x_k|| for every candidate. */
static int
score(const Inputs *in, double *mean, double *width)
{
    Py_ssize_t d = in->d;
    Py_ssize_t *idx = PyMem_Malloc(d * (sizeof(Py_ssize_t) + sizeof(double)) + 1);
    if (idx == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    double *val = (double *)(idx + d);
    const double *F = in->F.buf, *X = in->X.buf;
    const Py_ssize_t *slots = in->slots.buf;
    for (Py_ssize_t k = 0; k < in->K; k++) {
        const double *x = X + k * d;
        Py_ssize_t n = 0;
        for (Py_ssize_t i = 0; i < d; i++) {
            if (x[i] != 0.0) {
                idx[n] = i;
                val[n++] = x[i];
            }
        }
        const double *f = F + slots[k] * (d + 1) * d;
        double ss = 0.0;
        if (4 * n <= d) { /* gathering a quarter of the terms beats vector loads of all */
            mean[k] = sparse_dot(f, idx, val, n);
            for (Py_ssize_t j = 1; j <= d; j++) {
                double r = sparse_dot(f + j * d, idx, val, n);
                ss += r * r;
            }
        }
        else {
            double r[4];
            mean[k] = dense_dot(f, x, d);
            Py_ssize_t j = 1;
            for (; j + 4 <= d + 1; j += 4) {
                dense_dot4(f + j * d, x, d, r);
                ss += r[0] * r[0];
                ss += r[1] * r[1];
                ss += r[2] * r[2];
                ss += r[3] * r[3];
            }
            for (; j <= d; j++) {
                r[0] = dense_dot(f + j * d, x, d);
                ss += r[0] * r[0];
            }
        }
        width[k] = sqrt(ss);
    }
    PyMem_Free(idx);
    return 0;
}

/* math.fsum of n >= 0 finite or NaN values (CPython's algorithm: exact partials, then the
 * correctly rounded total); partials needs room for n doubles. */
static double
exact_sum(const double *values, Py_ssize_t n_values, double *partials)
{
    Py_ssize_t n = 0;
    for (Py_ssize_t v = 0; v < n_values; v++) {
        double x = values[v];
        if (isnan(x))
            return x;
        Py_ssize_t i = 0;
        for (Py_ssize_t j = 0; j < n; j++) {
            double y = partials[j];
            if (fabs(x) < fabs(y)) {
                double t = x;
                x = y;
                y = t;
            }
            double hi = x + y;
            double lo = y - (hi - x);
            if (lo != 0.0)
                partials[i++] = lo;
            x = hi;
        }
        n = i;
        if (x != 0.0)
            partials[n++] = x;
    }
    double hi = 0.0, lo = 0.0;
    if (n > 0) {
        hi = partials[--n];
        while (n > 0) {
            double x = hi, y = partials[--n];
            hi = x + y;
            lo = y - (hi - x);
            if (lo != 0.0)
                break;
        }
        /* half-even rounding across partials, as math.fsum */
        if (n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0))) {
            double y = lo * 2.0, x = hi + y;
            if (y == x - hi)
                hi = x;
        }
    }
    return hi;
}

/* base.draw_index(p, u); scratch holds K doubles. */
static Py_ssize_t
draw_index(const double *p, Py_ssize_t K, double u, double *scratch)
{
    if (K > 64) { /* np.cumsum, np.searchsorted(side="right"), else the last nonzero */
        double *cdf = scratch, acc = 0.0;
        for (Py_ssize_t i = 0; i < K; i++)
            cdf[i] = acc += p[i];
        double target = u * cdf[K - 1];
        Py_ssize_t lo = 0, hi = K; /* first i with cdf[i] > target */
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (cdf[mid] <= target)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < K)
            return lo;
        for (Py_ssize_t i = K - 1; i >= 0; i--)
            if (p[i] != 0.0)
                return i;
        return K - 1;
    }
    double target = u * exact_sum(p, K, scratch), acc = 0.0;
    Py_ssize_t last = 0;
    for (Py_ssize_t i = 0; i < K; i++) {
        if (p[i] > 0.0) {
            acc += p[i];
            last = i;
            if (target < acc)
                return i;
        }
    }
    return last;
}

PyDoc_STRVAR(mean_width_doc,
"mean_width(factor, slots, X, mean, width)\n\n"
"Fill mean[k] = x_k . theta and width[k] = ||L^T x_k|| of candidate k (arm slot slots[k]).");

static PyObject *
mean_width(PyObject *module, PyObject *args)
{
    PyObject *F, *slots, *X, *mean_obj, *width_obj;
    if (!PyArg_ParseTuple(args, "OOOOO:mean_width", &F, &slots, &X, &mean_obj, &width_obj))
        return NULL;
    Inputs in;
    if (get_inputs(F, slots, X, &in) < 0)
        return NULL;
    Py_buffer mean, width;
    if (get_array(mean_obj, &mean, 1, 'd', 1, "mean") < 0) {
        release_inputs(&in);
        return NULL;
    }
    if (get_array(width_obj, &width, 1, 'd', 1, "width") < 0) {
        PyBuffer_Release(&mean);
        release_inputs(&in);
        return NULL;
    }
    int rc = -1;
    if (mean.shape[0] != in.K || width.shape[0] != in.K)
        PyErr_SetString(PyExc_ValueError, "mean and width need one value per candidate");
    else
        rc = score(&in, mean.buf, width.buf);
    PyBuffer_Release(&width);
    PyBuffer_Release(&mean);
    release_inputs(&in);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(choose_doc,
"choose(factor, slots, X, coef, z, n_draws, eps0, u, p) -> chosen index\n\n"
"Fill p with the policy's distribution over the K candidates, floor mixed in, and return the\n"
"index drawn from it with uniform u. z None: greedy on mean + coef * width (LinUCB); else\n"
"the (ceil(n_draws / 2), K) standard normals of n_draws antithetic Thompson draws with\n"
"scale coef * width (LinTS).");

static PyObject *
choose(PyObject *module, PyObject *args)
{
    PyObject *F, *slots, *X, *z_obj, *p_obj;
    double coef, eps0, u;
    Py_ssize_t n_draws;
    if (!PyArg_ParseTuple(args, "OOOdOnddO:choose", &F, &slots, &X, &coef, &z_obj, &n_draws, &eps0, &u, &p_obj))
        return NULL;
    Inputs in;
    if (get_inputs(F, slots, X, &in) < 0)
        return NULL;
    Py_ssize_t K = in.K, half = (n_draws + 1) / 2;
    Py_buffer p_view, z_view;
    int have_z = z_obj != Py_None;
    if (get_array(p_obj, &p_view, 1, 'd', 1, "p") < 0) {
        release_inputs(&in);
        return NULL;
    }
    if (have_z && get_array(z_obj, &z_view, 2, 'd', 0, "z") < 0) {
        PyBuffer_Release(&p_view);
        release_inputs(&in);
        return NULL;
    }
    Py_ssize_t chosen = -1;
    double *mean = NULL;
    if (p_view.shape[0] != K)
        PyErr_SetString(PyExc_ValueError, "p needs one value per candidate");
    else if (have_z && (n_draws < 1 || z_view.shape[0] != half || z_view.shape[1] != K))
        PyErr_SetString(PyExc_ValueError, "z must be (ceil(n_draws / 2), K) with n_draws >= 1");
    else if ((mean = PyMem_Malloc(3 * K * sizeof(double))) == NULL)
        PyErr_NoMemory();
    else if (score(&in, mean, mean + K) == 0) {
        double *width = mean + K, *scratch = mean + 2 * K, *p = p_view.buf;
        if (have_z) {
            const double *z = z_view.buf;
            double *scale = width; /* scale = v * width, in place */
            for (Py_ssize_t k = 0; k < K; k++) {
                scale[k] = coef * width[k];
                p[k] = 0.0;
            }
            for (Py_ssize_t r = 0; r < n_draws; r++) {
                const double *zr = z + (r < half ? r : r - half) * K;
                Py_ssize_t best = 0;
                double top = 0.0;
                for (Py_ssize_t k = 0; k < K; k++) {
                    double noise = zr[k] * scale[k];
                    double s = (r < half ? noise : -noise) + mean[k];
                    if (k == 0 || !(s <= top)) { /* numpy's argmax: first maximum, NaN wins */
                        top = s;
                        best = k;
                        if (isnan(top))
                            break;
                    }
                }
                p[best] += 1.0; /* counts are exact in a double */
            }
            for (Py_ssize_t k = 0; k < K; k++)
                p[k] = p[k] / (double)n_draws;
        }
        else {
            double *s = scratch;
            for (Py_ssize_t k = 0; k < K; k++)
                s[k] = mean[k] + coef * width[k];
            double top = s[0];
            for (Py_ssize_t k = 1; k < K && !isnan(top); k++) /* numpy's max: NaN propagates */
                if (!(s[k] <= top))
                    top = s[k];
            Py_ssize_t ties = 0;
            for (Py_ssize_t k = 0; k < K; k++)
                ties += s[k] == top;
            for (Py_ssize_t k = 0; k < K; k++) /* a NaN max ties nothing: 0 / 0, as numpy */
                p[k] = (double)(s[k] == top) / (double)ties;
        }
        if (eps0 > 0.0) {
            double keep = 1.0 - eps0, floor = eps0 / (double)K;
            for (Py_ssize_t k = 0; k < K; k++) {
                p[k] *= keep;
                p[k] += floor;
            }
        }
        chosen = draw_index(p, K, u, scratch);
    }
    PyMem_Free(mean);
    if (have_z)
        PyBuffer_Release(&z_view);
    PyBuffer_Release(&p_view);
    release_inputs(&in);
    if (chosen < 0)
        return NULL;
    return PyLong_FromSsize_t(chosen);
}

PyDoc_STRVAR(repeated_row_doc,
"repeated_row(out, slots, weights, intercept)\n\n"
"Fill every row of out (n, d) with the vector whose coordinate slots[t] sums weights[t] (in\n"
"order, from 0.0), coordinate 0 then set to 1.0 if intercept: FeatureEncoder._row repeated.");

static PyObject *
repeated_row(PyObject *module, PyObject *args)
{
    PyObject *out_obj, *slots_obj, *weights_obj;
    int intercept;
    if (!PyArg_ParseTuple(args, "OOOp:repeated_row", &out_obj, &slots_obj, &weights_obj, &intercept))
        return NULL;
    Py_buffer out;
    if (get_array(out_obj, &out, 2, 'd', 1, "out") < 0)
        return NULL;
    PyObject *slots = PySequence_Fast(slots_obj, "slots must be a sequence");
    PyObject *weights = slots ? PySequence_Fast(weights_obj, "weights must be a sequence") : NULL;
    Py_ssize_t n = out.shape[0], d = out.shape[1];
    double *row = out.buf;
    int ok = weights != NULL;
    if (ok && PySequence_Fast_GET_SIZE(slots) != PySequence_Fast_GET_SIZE(weights)) {
        PyErr_SetString(PyExc_ValueError, "slots and weights must have the same length");
        ok = 0;
    }
    if (ok && n > 0) {
        for (Py_ssize_t i = 0; i < d; i++)
            row[i] = 0.0;
        for (Py_ssize_t t = 0; ok && t < PySequence_Fast_GET_SIZE(slots); t++) {
            Py_ssize_t slot = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(slots, t));
            double w = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(weights, t));
            if (PyErr_Occurred())
                ok = 0;
            else if (slot < 0 || slot >= d) {
                PyErr_Format(PyExc_IndexError, "slot %zd out of range for dimension %zd", slot, d);
                ok = 0;
            }
            else
                row[slot] += w;
        }
        if (ok && intercept && d > 0)
            row[0] = 1.0;
        for (Py_ssize_t k = 1; ok && k < n; k++)
            memcpy(row + k * d, row, d * sizeof(double));
    }
    Py_XDECREF(weights);
    Py_XDECREF(slots);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(all_finite_doc,
"all_finite(a) -> bool\n\n"
"Whether every value of a C-contiguous float64 array is finite: for the few rows of a\n"
"decision, where numpy's isfinite(a).all() is mostly fixed cost (large arrays: use numpy).");

static PyObject *
all_finite(PyObject *module, PyObject *obj)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    const char *f = view.format ? view.format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    if (strcmp(f, "d") != 0 || view.itemsize != sizeof(double)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "all_finite needs a C-contiguous float64 array");
        return NULL;
    }
    const double *x = view.buf;
    Py_ssize_t n = view.len / (Py_ssize_t)sizeof(double);
    int finite = 1;
    for (Py_ssize_t i = 0; i < n && finite; i++)
        finite = isfinite(x[i]);
    PyBuffer_Release(&view);
    return PyBool_FromLong(finite);
}

static PyMethodDef methods[] = {
    {"mean_width", mean_width, METH_VARARGS, mean_width_doc},
    {"choose", choose, METH_VARARGS, choose_doc},
    {"repeated_row", repeated_row, METH_VARARGS, repeated_row_doc},
    {"all_finite", all_finite, METH_O, all_finite_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "learner._fastscore",
    "The SDK's decision step compiled (linear scores, draws, floor, choice; candidate rows of\n"
    "per-arm models); see learner/_fastscore.c.", -1, methods,
};

PyMODINIT_FUNC
PyInit__fastscore(void)
{
    return PyModule_Create(&module);
}
