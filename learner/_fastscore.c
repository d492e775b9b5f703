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
 *   - inverse-gap weighting (LinIGW) with learning rate g > 0: on score = mean + alpha * width,
 *     b the first maximum, p_k = 1 / (K + g * (score_b - score_k)) for k != b and
 *     p_b = 1 - fsum(others) (math.fsum, as the numpy path), after raising each candidate
 *     whose arm has fewer than new_rows rows to min(new_share * Phi((mean_k - score_b) /
 *     width_k), 1 / K), Phi(x) = erfc(-x / sqrt 2) / 2 (LinIGW's new arms);
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
 * Also: rank_one() and add_outer() are the shared models' in-place updates (the factor, and
 * A; learner.linalg.rank_one_update, learner/policies/_linear.py), repeated_row() builds the
 * (K, d) candidate rows of a per-arm model (the context row, K times; learner.features),
 * all_finite() checks rows before scoring (learner.policies.base), detect() is the per-arm
 * linear policies' change detector over a batch (learner/policies/_detect.py), fourier() a
 * portfolio's random Fourier features of rows (learner/policies/_fourier.py),
 * and hash_record() and assemble() are FeatureEncoder's per-record hashing and batch summing
 * (learner.features), the encoding the join worker spends most on.
 * Python (numpy) stays the fallback for all of it when this module is not built.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
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

/* mean[k] = F_{s_k}[0] . x_k and width[k] = ||F_{s_k}[1:] x_k|| for every candidate (0 without
   widths: a rule that never reads them, e.g. SquareCB's, skips the d x d product). */
static int
score(const Inputs *in, double *mean, double *width, int widths)
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
        if (!widths) {
            mean[k] = 4 * n <= d ? sparse_dot(f, idx, val, n) : dense_dot(f, x, d);
        }
        else if (4 * n <= d) { /* gathering a quarter of the terms beats vector loads of all */
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
        rc = score(&in, mean.buf, width.buf, 1);
    PyBuffer_Release(&width);
    PyBuffer_Release(&mean);
    release_inputs(&in);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(choose_doc,
"choose(factor, slots, X, coef, z, n_draws, igw, eps0, u, p[, count, new_rows, new_share]) -> chosen index\n\n"
"Fill p with the policy's distribution over the K candidates, floor mixed in, and return the\n"
"index drawn from it with uniform u. z None: on the scores mean + coef * width, greedy\n"
"(LinUCB) when igw is 0, else inverse-gap weighting with learning rate igw (LinIGW), a\n"
"candidate whose arm has fewer than new_rows rows (count, by slot) raised to\n"
"min(new_share * Phi((mean - best score) / width), 1 / K); z given: the (ceil(n_draws / 2), K)\n"
"standard normals of n_draws antithetic Thompson draws with scale coef * width (LinTS).");

static PyObject *
choose(PyObject *module, PyObject *args)
{
    PyObject *F, *slots, *X, *z_obj, *p_obj, *count_obj = Py_None;
    double coef, igw, eps0, u, new_share = 0.0;
    Py_ssize_t n_draws, new_rows = 0;
    if (!PyArg_ParseTuple(args, "OOOdOndddO|Ond:choose", &F, &slots, &X, &coef, &z_obj, &n_draws, &igw, &eps0, &u,
                          &p_obj, &count_obj, &new_rows, &new_share))
        return NULL;
    Inputs in;
    if (get_inputs(F, slots, X, &in) < 0)
        return NULL;
    Py_ssize_t K = in.K, half = (n_draws + 1) / 2;
    Py_buffer p_view, z_view, count_view;
    int have_z = z_obj != Py_None, have_count = count_obj != Py_None;
    if (get_array(p_obj, &p_view, 1, 'd', 1, "p") < 0) {
        release_inputs(&in);
        return NULL;
    }
    if (have_z && get_array(z_obj, &z_view, 2, 'd', 0, "z") < 0) {
        PyBuffer_Release(&p_view);
        release_inputs(&in);
        return NULL;
    }
    if (have_count && get_array(count_obj, &count_view, 1, 'n', 0, "count") < 0)
        have_count = -1;
    else if (have_count && count_view.shape[0] < in.F.shape[0]) {
        PyErr_SetString(PyExc_ValueError, "count needs one value per arm slot of factor");
        PyBuffer_Release(&count_view);
        have_count = -1;
    }
    if (have_count < 0) {
        if (have_z)
            PyBuffer_Release(&z_view);
        PyBuffer_Release(&p_view);
        release_inputs(&in);
        return NULL;
    }
    /* new arms only under inverse-gap weighting, and only when a candidate's arm is new */
    const Py_ssize_t *count = have_count ? count_view.buf : NULL, *slot = in.slots.buf;
    int new_arms = 0;
    if (have_count && !have_z && igw > 0.0 && new_share > 0.0)
        for (Py_ssize_t k = 0; k < K && !new_arms; k++)
            new_arms = count[slot[k]] < new_rows;
    Py_ssize_t chosen = -1;
    double *mean = NULL;
    if (p_view.shape[0] != K)
        PyErr_SetString(PyExc_ValueError, "p needs one value per candidate");
    else if (have_z && (n_draws < 1 || z_view.shape[0] != half || z_view.shape[1] != K))
        PyErr_SetString(PyExc_ValueError, "z must be (ceil(n_draws / 2), K) with n_draws >= 1");
    else if (!(igw >= 0.0 && isfinite(igw)))
        PyErr_SetString(PyExc_ValueError, "igw must be finite and >= 0");
    else if (!(new_share >= 0.0 && new_share <= 1.0))
        PyErr_SetString(PyExc_ValueError, "new_share must be in [0, 1]");
    else if ((mean = PyMem_Malloc(4 * K * sizeof(double))) == NULL)
        PyErr_NoMemory();
    else if (score(&in, mean, mean + K, have_z || coef != 0.0 || new_arms) == 0) {
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
        else if (igw > 0.0) {
            double *s = scratch;
            Py_ssize_t best = 0;
            for (Py_ssize_t k = 0; k < K; k++) {
                s[k] = mean[k] + coef * width[k];
                if (k > 0 && !(s[k] <= s[best]) && !isnan(s[best])) /* numpy's argmax: first maximum, NaN wins */
                    best = k;
            }
            for (Py_ssize_t k = 0; k < K; k++)
                p[k] = k == best ? 0.0 : 1.0 / ((double)K + igw * (s[best] - s[k]));
            if (new_arms) { /* LinIGW._new_arm_floor, the same operations */
                double cap = 1.0 / (double)K;
                for (Py_ssize_t k = 0; k < K; k++) {
                    if (k == best || count[slot[k]] >= new_rows || !(width[k] > 0.0))
                        continue;
                    double q = new_share * (0.5 * erfc((s[best] - mean[k]) / (width[k] * M_SQRT2)));
                    q = q < cap ? q : cap;
                    if (q > p[k])
                        p[k] = q;
                }
            }
            p[best] = 1.0 - exact_sum(p, K, mean + 3 * K);
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
    if (have_count)
        PyBuffer_Release(&count_view);
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

/* ---- the shared models' rank-one update (learner/linalg.py: rank_one_update) ---------------
 *
 * The factor F = [theta^T; L^T] (d+1, d) of a precision A = C C^T (L^T = C^-1, lower
 * triangular, zeros above the diagonal) and of b becomes that of A + z z^T and b + y z, in
 * O(d^2): Carlson's triangular square-root update of the covariance U U^T = A^-1, U = L, for
 * one observation z of unit noise variance (N. A. Carlson (1973), "Fast triangular formulation
 * of the square root filter", AIAA Journal 11(9)). With f = L^T z, alpha_{-1} = 1 and, row j
 * of L^T in turn,
 *
 *     alpha_j = alpha_{j-1} + f_j^2      beta_j = alpha_{j-1} / s_j      gamma_j = f_j / s_j
 *     s_j = sqrt(alpha_{j-1}) sqrt(alpha_j)   L^T[j, i] <- beta_j L^T[j, i] - gamma_j e_i   (i <= j)
 *     e_i <- e_i + L^T[j, i] f_j   (the value before the update; e starts at 0, ends at A^-1 z)
 *
 * and theta <- theta + e (y - z . theta) / alpha_{d-1} (the Kalman gain). Every operation is
 * the numpy reference's, in its order: f_j in two lanes (even and odd columns, each summed in
 * column order from 0, then added), z . theta and e in index order from 0, no fused
 * multiply-adds (-ffp-contract=off). So both give the same bits, and a learner gives the same
 * posterior whether or not this module is built. */

/* f[r] = row r . z over the columns [0, n) of the nb (<= 4) consecutive rows at L (row
 * stride d), each in two lanes; columns past a row's diagonal hold zeros and add nothing */
static inline __attribute__((always_inline)) void
lane_dots(const double *L, Py_ssize_t d, const double *z, Py_ssize_t n, int nb, double *f)
{
    v2 acc[4] = {{0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}};
    Py_ssize_t i = 0;
    if (nb == 4) { /* the usual case: four independent chains in flight */
        const double *r0 = L, *r1 = L + d, *r2 = L + 2 * d, *r3 = L + 3 * d;
        v2 a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
        for (; i + 2 <= n; i += 2) {
            v2 zi = load2(z + i);
            a0 += load2(r0 + i) * zi;
            a1 += load2(r1 + i) * zi;
            a2 += load2(r2 + i) * zi;
            a3 += load2(r3 + i) * zi;
        }
        acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
    } else {
        for (; i + 2 <= n; i += 2) {
            v2 zi = load2(z + i);
            for (int r = 0; r < nb; r++)
                acc[r] += load2(L + r * d + i) * zi;
        }
    }
    for (int r = 0; r < nb; r++) {
        double even = acc[r][0], odd = acc[r][1];
        if (i < n) /* n odd: the last column is even */
            even += L[r * d + i] * z[i];
        f[r] = even + odd;
    }
}

/* lane_dots as a function of its own: the narrow copy of the update runs faster so (its
 * accumulators stay in registers; measured), the AVX2 copy slower (it inlines lane_dots) */
static __attribute__((noinline)) void
lane_dots_apart(const double *L, Py_ssize_t d, const double *z, Py_ssize_t n, int nb, double *f)
{
    lane_dots(L, d, z, n, nb, f);
}

static inline __attribute__((always_inline)) void
store2(double *p, v2 v)
{
    memcpy(p, &v, sizeof v);
}

/* The elementwise loops below run four doubles at a time (one AVX register) in the copy of
 * the update compiled for AVX2 (chosen at import when the CPU has it), two (SSE2, NEON)
 * otherwise: elementwise arithmetic, so both copies give the same bits. `wide` is a constant
 * in each copy. */
#pragma GCC diagnostic ignored "-Wpsabi" /* v4 values never cross a call (all inlined); GCC
                                           * reports it at the end of the file, hence no pop */
typedef double v4 __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) v4
load4(const double *p)
{
    v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void
store4(double *p, v4 v)
{
    memcpy(p, &v, sizeof v);
}

/* row[i] <- beta row[i] - gamma e[i] and e[i] <- e[i] + row[i] f (row[i] as it was), i < n */
static inline __attribute__((always_inline)) void
sweep(double *row, double *e, Py_ssize_t n, double beta, double gamma, double f, int wide)
{
    Py_ssize_t i = 0;
    if (wide) {
        v4 bv = {beta, beta, beta, beta}, gv = {gamma, gamma, gamma, gamma}, fv = {f, f, f, f};
        for (; i + 4 <= n; i += 4) {
            v4 u = load4(row + i), ev = load4(e + i);
            store4(row + i, bv * u - gv * ev);
            store4(e + i, ev + u * fv);
        }
    }
    v2 bv = {beta, beta}, gv = {gamma, gamma}, fv = {f, f};
    for (; i + 2 <= n; i += 2) {
        v2 u = load2(row + i), ev = load2(e + i);
        store2(row + i, bv * u - gv * ev);
        store2(e + i, ev + u * fv);
    }
    for (; i < n; i++) {
        double u = row[i];
        row[i] = beta * u - gamma * e[i];
        e[i] = e[i] + u * f;
    }
}

/* row[j] <- row[j] + c z[j], j < n */
static inline __attribute__((always_inline)) void
add_scaled(double *row, const double *z, Py_ssize_t n, double c, int wide)
{
    Py_ssize_t j = 0;
    if (wide) {
        v4 cv = {c, c, c, c};
        for (; j + 4 <= n; j += 4)
            store4(row + j, load4(row + j) + cv * load4(z + j));
    }
    v2 cv = {c, c};
    for (; j + 2 <= n; j += 2)
        store2(row + j, load2(row + j) + cv * load2(z + j));
    for (; j < n; j++)
        row[j] = row[j] + c * z[j];
}

/* The k rows (Z, y) in order into F (see above); with b (not NULL), each row also adds
 * b += y z. e: scratch of d doubles. */
static inline __attribute__((always_inline)) void
rank_one_rows(double *F, double *b, Py_ssize_t d, const double *Z, const double *y, Py_ssize_t k, double *e, int wide)
{
    double *theta = F, *L = F + d;
    for (Py_ssize_t t = 0; t < k; t++) {
        const double *z = Z + t * d;
        if (b)
            for (Py_ssize_t i = 0; i < d; i++)
                b[i] = b[i] + z[i] * y[t];
        double zt = 0.0;
        for (Py_ssize_t i = 0; i < d; i++)
            zt += z[i] * theta[i];
        memset(e, 0, (size_t)d * sizeof(double));
        double alpha = 1.0, root = 1.0; /* root = sqrt(alpha): no product of alphas overflows */
        for (Py_ssize_t j0 = 0; j0 < d; j0 += 4) {
            int nb = d - j0 < 4 ? (int)(d - j0) : 4;
            double f[4];
            if (wide) /* old rows: a sweep changes its own row alone */
                lane_dots(L + j0 * d, d, z, j0 + nb, nb, f);
            else
                lane_dots_apart(L + j0 * d, d, z, j0 + nb, nb, f);
            for (int r = 0; r < nb; r++) {
                Py_ssize_t j = j0 + r;
                double prev = alpha, prev_root = root;
                alpha = prev + f[r] * f[r];
                root = sqrt(alpha);
                double s = prev_root * root;
                sweep(L + j * d, e, j + 1, prev / s, f[r] / s, f[r], wide);
            }
        }
        double g = (y[t] - zt) / alpha;
        for (Py_ssize_t i = 0; i < d; i++)
            theta[i] = theta[i] + e[i] * g;
    }
}

/* A += z z^T for the k rows z of Z in turn: every entry gets its k products added one after
 * another, the bits of k one-row updates, with each row of A read from and written to memory
 * once for all k (it stays in the L1 cache meanwhile). */
static inline __attribute__((always_inline)) void
outer_rows(double *A, Py_ssize_t d, const double *Z, Py_ssize_t k, int wide)
{
    for (Py_ssize_t i = 0; i < d; i++)
        for (Py_ssize_t t = 0; t < k; t++)
            add_scaled(A + i * d, Z + t * d, d, Z[t * d + i], wide);
}

static void
rank_one_narrow(double *F, double *b, Py_ssize_t d, const double *Z, const double *y, Py_ssize_t k, double *e)
{
    rank_one_rows(F, b, d, Z, y, k, e, 0);
}

static void
outer_narrow(double *A, Py_ssize_t d, const double *Z, Py_ssize_t k)
{
    outer_rows(A, d, Z, k, 0);
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_WIDE 1
__attribute__((target("avx2"))) static void
rank_one_wide(double *F, double *b, Py_ssize_t d, const double *Z, const double *y, Py_ssize_t k, double *e)
{
    rank_one_rows(F, b, d, Z, y, k, e, 1);
}

__attribute__((target("avx2"))) static void
outer_wide(double *A, Py_ssize_t d, const double *Z, Py_ssize_t k)
{
    outer_rows(A, d, Z, k, 1);
}
#define WIDE (__builtin_cpu_supports("avx2"))
#else
#define WIDE 0
#endif

static PyObject *
rank_one(PyObject *module, PyObject *args)
{
    PyObject *F_obj, *Z_obj, *y_obj, *b_obj;
    if (!PyArg_ParseTuple(args, "OOOO:rank_one", &F_obj, &Z_obj, &y_obj, &b_obj))
        return NULL;
    Py_buffer F, Z, y, b;
    int have_F = 0, have_Z = 0, have_y = 0, have_b = 0, ok;
    ok = (have_F = get_array(F_obj, &F, 2, 'd', 1, "factor") == 0)
         && (have_Z = get_array(Z_obj, &Z, 2, 'd', 0, "Z") == 0)
         && (have_y = get_array(y_obj, &y, 1, 'd', 0, "y") == 0)
         && (b_obj == Py_None || (have_b = get_array(b_obj, &b, 1, 'd', 1, "b") == 0));
    double *e = NULL;
    if (ok) {
        Py_ssize_t d = F.shape[1], k = Z.shape[0];
        if (F.shape[0] != d + 1 || Z.shape[1] != d || y.shape[0] != k || (have_b && b.shape[0] != d)) {
            PyErr_SetString(PyExc_ValueError, "rank_one needs factor (d+1, d), Z (k, d), y (k,) and b (d,) or None");
            ok = 0;
        } else if (!(e = PyMem_Malloc((size_t)(d > 0 ? d : 1) * sizeof(double)))) {
            PyErr_NoMemory();
            ok = 0;
        } else {
            double *bb = have_b ? b.buf : NULL;
            Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_WIDE
            if (WIDE)
                rank_one_wide(F.buf, bb, d, Z.buf, y.buf, k, e);
            else
#endif
                rank_one_narrow(F.buf, bb, d, Z.buf, y.buf, k, e);
            Py_END_ALLOW_THREADS
        }
    }
    PyMem_Free(e);
    if (have_b)
        PyBuffer_Release(&b);
    if (have_y)
        PyBuffer_Release(&y);
    if (have_Z)
        PyBuffer_Release(&Z);
    if (have_F)
        PyBuffer_Release(&F);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(rank_one_doc,
"rank_one(factor, Z, y, b) -> None\n\n"
"Fold the k rows (Z[r], y[r]) in order into factor = [theta^T; L^T] (d+1, d), in place: each\n"
"a rank-one update of the precision A -> A + z z^T, b -> b + y z (learner.linalg.\n"
"rank_one_update, the numpy reference, gives the same bits). b (d,) is updated too, row by\n"
"row, unless None; A is add_outer's.");

static PyObject *
add_outer(PyObject *module, PyObject *args)
{
    PyObject *A_obj, *Z_obj;
    if (!PyArg_ParseTuple(args, "OO:add_outer", &A_obj, &Z_obj))
        return NULL;
    Py_buffer A, Z;
    if (get_array(A_obj, &A, 2, 'd', 1, "A") < 0)
        return NULL;
    if (get_array(Z_obj, &Z, 2, 'd', 0, "Z") < 0) {
        PyBuffer_Release(&A);
        return NULL;
    }
    Py_ssize_t d = A.shape[0], k = Z.shape[0];
    int ok = A.shape[1] == d && Z.shape[1] == d;
    if (!ok)
        PyErr_SetString(PyExc_ValueError, "add_outer needs A (d, d) and Z (k, d)");
    else {
        Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_WIDE
        if (WIDE)
            outer_wide(A.buf, d, Z.buf, k);
        else
#endif
            outer_narrow(A.buf, d, Z.buf, k);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&Z);
    PyBuffer_Release(&A);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(add_outer_doc,
"add_outer(A, Z) -> None\n\n"
"A += z z^T for each row z of Z (k, d), in order, in place: the bits of k one-row updates\n"
"A += z[:, None] @ z[None, :], in one pass over A.");

/* ---- the per-arm change detector (learner/policies/_detect.py: _detect_arms) ---------------
 *
 * The numpy reference's loop over the arms of a batch, with the same operations in the same
 * order, so a learner's detector state has the same bits whether or not this module is built:
 *
 *   - residual e = r - x . theta, the dot summed left to right from the first product
 *     (_row_dots: a cumulative sum), only for rows of weight > 0;
 *   - z = clip((e - total / n) / max(sqrt(pi / 2) * total_abs / n, 1e-12), -CLIP, CLIP);
 *   - each side's g_t = W_t - min(0, min_(s<=t) W_s), W_t = g_0 + (steps_1 + ... + steps_t)
 *     summed left to right (_page_hinkley: np.cumsum and np.minimum.accumulate; steps are
 *     z - DELTA and -z - DELTA, never -0.0, so no W is -0.0 and no tie between zeros of two
 *     signs arises); an alarm at the first t where either g_t exceeds the threshold;
 *   - with p_k = decay^k as running products (p_0 = 1, p_k = p_(k-1) * decay; np.cumprod) and
 *     the arm's m learned residuals e_1..e_m: n <- p_m n + (p_(m-1) + ... + p_0), and total,
 *     total_abs alike with p_(m-i) e_i and p_(m-i) |e_i|, each sum left to right from its
 *     first term (np.cumsum), unless the batch leaves g+ or g- above the hold level (then only
 *     rows counts them).
 *
 * Plain double arithmetic, no fused multiply-adds (-ffp-contract=off), no reassociation. */

static inline double
row_dot(const double *x, const double *t, Py_ssize_t d)
{
    double s = x[0] * t[0];
    for (Py_ssize_t i = 1; i < d; i++)
        s += x[i] * t[i];
    return s;
}

/* row_dot of four rows at once: four independent chains in flight (one would wait on each
 * addition's latency), each row's sum in its own order as above */
static inline void
row_dots4(const double *x0, const double *x1, const double *x2, const double *x3, const double *t, Py_ssize_t d,
          double *out)
{
    double s0 = x0[0] * t[0], s1 = x1[0] * t[0], s2 = x2[0] * t[0], s3 = x3[0] * t[0];
    for (Py_ssize_t i = 1; i < d; i++) {
        s0 += x0[i] * t[i];
        s1 += x1[i] * t[i];
        s2 += x2[i] * t[i];
        s3 += x3[i] * t[i];
    }
    out[0] = s0;
    out[1] = s1;
    out[2] = s2;
    out[3] = s3;
}

enum { D_STATS, D_PH, D_ROWS, D_ALARMS, D_KEEP, D_SLOTS, D_STARTS, D_COUNTS, D_X, D_R, D_W, D_THETA, D_N };

PyDoc_STRVAR(detect_doc,
"detect(stats, ph, rows, alarms, keep, slots, starts, counts, X, r, w, theta,\n"
"       (watch_after, calibration, decay, sd_from_mean_abs, delta, clip, threshold, keep_on_alarm, hold))\n\n"
"learner.policies._detect._detect_arms compiled: the residual change detector over a batch whose\n"
"arm j (slot slots[j]) has the rows [starts[j], starts[j] + counts[j]) of X (n, d), r and w.\n"
"Updates the arms' detector state in place (stats (cap, 3), ph (cap, 2), rows and alarms (cap,)\n"
"int64) and sets keep[j] = keep_on_alarm for an arm flagged. The arms with rows[slot] >=\n"
"watch_after when the call starts are the watched ones; theta holds their posterior means, one\n"
"row each, in order. An arm whose g+ or g- ends the batch above hold (unflagged) keeps its\n"
"residual mean and scale as they were.");

static PyObject *
detect(PyObject *module, PyObject *args)
{
    static const struct {
        int ndim;
        char kind;
        int writable;
        const char *name;
    } spec[D_N] = {
        {2, 'd', 1, "stats"}, {2, 'd', 1, "ph"},     {1, 'n', 1, "rows"},   {1, 'n', 1, "alarms"},
        {1, 'd', 1, "keep"},  {1, 'n', 0, "slots"},  {1, 'n', 0, "starts"}, {1, 'n', 0, "counts"},
        {2, 'd', 0, "X"},     {1, 'd', 0, "r"},      {1, 'd', 0, "w"},      {2, 'd', 0, "theta"},
    };
    PyObject *obj[D_N];
    Py_ssize_t watch_after;
    double calibration, decay, sd_from_mean_abs, delta, clip, threshold, keep_on_alarm, hold;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOO(ndddddddd):detect", &obj[D_STATS], &obj[D_PH], &obj[D_ROWS],
                          &obj[D_ALARMS], &obj[D_KEEP], &obj[D_SLOTS], &obj[D_STARTS], &obj[D_COUNTS], &obj[D_X],
                          &obj[D_R], &obj[D_W], &obj[D_THETA], &watch_after, &calibration, &decay,
                          &sd_from_mean_abs, &delta, &clip, &threshold, &keep_on_alarm, &hold))
        return NULL;
    Py_buffer v[D_N];
    int got = 0, ok = 1;
    for (; got < D_N; got++) {
        if (get_array(obj[got], &v[got], spec[got].ndim, spec[got].kind, spec[got].writable, spec[got].name) < 0) {
            ok = 0;
            break;
        }
    }
    char *block = NULL;
    Py_ssize_t cap = 0, n_arms = 0, n = 0, d = 0, maxk = 0;
    if (ok) {
        cap = v[D_STATS].shape[0];
        n_arms = v[D_SLOTS].shape[0];
        n = v[D_X].shape[0];
        d = v[D_X].shape[1];
        if (v[D_STATS].shape[1] != 3 || v[D_PH].shape[0] != cap || v[D_PH].shape[1] != 2 || v[D_ROWS].shape[0] != cap
            || v[D_ALARMS].shape[0] != cap || v[D_KEEP].shape[0] != n_arms || v[D_STARTS].shape[0] != n_arms
            || v[D_COUNTS].shape[0] != n_arms || v[D_R].shape[0] != n || v[D_W].shape[0] != n || d < 1
            || v[D_THETA].shape[1] != d) {
            PyErr_SetString(PyExc_ValueError,
                            "detect needs stats (cap, 3), ph (cap, 2), rows and alarms (cap,), keep, slots, starts "
                            "and counts (arms,), X (n, d >= 1), r and w (n,), theta (watched, d)");
            ok = 0;
        }
    }
    const Py_ssize_t *slots = ok ? v[D_SLOTS].buf : NULL, *starts = ok ? v[D_STARTS].buf : NULL;
    const Py_ssize_t *counts = ok ? v[D_COUNTS].buf : NULL;
    Py_ssize_t *rows = ok ? v[D_ROWS].buf : NULL, n_watched = 0;
    for (Py_ssize_t j = 0; ok && j < n_arms; j++) {
        if (slots[j] < 0 || slots[j] >= cap) {
            PyErr_Format(PyExc_IndexError, "slot %zd out of range for %zd arms", slots[j], cap);
            ok = 0;
        }
        else if (starts[j] < 0 || counts[j] < 0 || starts[j] > n - counts[j]) {
            PyErr_Format(PyExc_IndexError, "arm %zd's rows [%zd, %zd + %zd) are not within the batch's %zd", j,
                         starts[j], starts[j], counts[j], n);
            ok = 0;
        }
        else {
            n_watched += rows[slots[j]] >= watch_after;
            if (counts[j] > maxk)
                maxk = counts[j];
        }
    }
    if (ok && n_watched != v[D_THETA].shape[0]) {
        PyErr_Format(PyExc_ValueError, "theta has %zd rows for %zd watched arms", v[D_THETA].shape[0], n_watched);
        ok = 0;
    }
    /* scratch: p_0..p_maxk, the residuals of one arm, its learned rows, the watched flags */
    if (ok && !(block = PyMem_Malloc((size_t)(2 * maxk + 1) * sizeof(double) + (size_t)maxk * sizeof(Py_ssize_t)
                                     + (size_t)n_arms + 1))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        double *powers = (double *)block, *e = powers + maxk + 1;
        Py_ssize_t *learned = (Py_ssize_t *)(e + maxk);
        char *watched = (char *)(learned + maxk);
        double *stats = v[D_STATS].buf, *ph = v[D_PH].buf, *keep = v[D_KEEP].buf;
        Py_ssize_t *alarms = v[D_ALARMS].buf;
        const double *X = v[D_X].buf, *r = v[D_R].buf, *w = v[D_W].buf, *theta = v[D_THETA].buf;
        powers[0] = 1.0;
        for (Py_ssize_t k = 1; k <= maxk; k++)
            powers[k] = powers[k - 1] * decay;
        for (Py_ssize_t j = 0; j < n_arms; j++) /* as the call finds them, before any changes */
            watched[j] = rows[slots[j]] >= watch_after;
        for (Py_ssize_t j = 0, t = 0; j < n_arms; j++) {
            Py_ssize_t slot = slots[j], lo = starts[j], k = counts[j], m = 0;
            if (!watched[j]) {
                for (Py_ssize_t i = lo; i < lo + k; i++)
                    m += w[i] > 0.0;
                rows[slot] += m;
                continue;
            }
            const double *th = theta + (t++) * d;
            for (Py_ssize_t i = lo; i < lo + k; i++)
                if (w[i] > 0.0)
                    learned[m++] = i;
            if (m == 0)
                continue;
            Py_ssize_t q = 0;
            for (; q + 4 <= m; q += 4) {
                const Py_ssize_t *at = learned + q;
                row_dots4(X + at[0] * d, X + at[1] * d, X + at[2] * d, X + at[3] * d, th, d, e + q);
                for (int u = 0; u < 4; u++)
                    e[q + u] = r[at[u]] - e[q + u];
            }
            for (; q < m; q++)
                e[q] = r[learned[q]] - row_dot(X + learned[q] * d, th, d);
            double *st = stats + 3 * slot, *g = ph + 2 * slot;
            double count = st[0], total = st[1], total_abs = st[2];
            int holding = 0;
            if (count >= calibration) {
                double scale = sd_from_mean_abs * total_abs / count;
                if (1e-12 > scale) /* Python's max(scale, 1e-12) */
                    scale = 1e-12;
                double mean = total / count, start_up = g[0], start_down = g[1];
                double sum_up = 0.0, sum_down = 0.0, min_up = 0.0, min_down = 0.0, up = 0.0, down = 0.0;
                int alarm = 0;
                for (Py_ssize_t i = 0; i < m; i++) {
                    double z = (e[i] - mean) / scale;
                    if (z < -clip)
                        z = -clip;
                    else if (z > clip)
                        z = clip;
                    double step_up = z - delta, step_down = -z - delta;
                    sum_up = i == 0 ? step_up : sum_up + step_up;
                    sum_down = i == 0 ? step_down : sum_down + step_down;
                    double w_up = start_up + sum_up, w_down = start_down + sum_down;
                    if (i == 0 || w_up < min_up)
                        min_up = w_up;
                    if (i == 0 || w_down < min_down)
                        min_down = w_down;
                    up = w_up - (min_up < 0.0 ? min_up : 0.0);
                    down = w_down - (min_down < 0.0 ? min_down : 0.0);
                    if (up > threshold || down > threshold) {
                        alarm = 1;
                        break;
                    }
                }
                if (alarm) { /* back to the start; the batch's later rows are not tested */
                    keep[j] = keep_on_alarm;
                    alarms[slot] += 1;
                    st[0] = st[1] = st[2] = 0.0;
                    g[0] = g[1] = 0.0;
                    rows[slot] = 0;
                    continue;
                }
                g[0] = up;
                g[1] = down;
                holding = up > hold || down > hold; /* half way to an alarm: the baseline holds */
            }
            if (!holding) {
                double p = powers[m - 1];
                double sum_w = p, sum_e = p * e[0], sum_abs = p * fabs(e[0]);
                for (Py_ssize_t i = 1; i < m; i++) {
                    p = powers[m - 1 - i];
                    sum_w += p;
                    sum_e += p * e[i];
                    sum_abs += p * fabs(e[i]);
                }
                double old = powers[m];
                st[0] = old * count + sum_w;
                st[1] = old * total + sum_e;
                st[2] = old * total_abs + sum_abs;
            }
            rows[slot] += m;
        }
    }
    PyMem_Free(block);
    while (got > 0)
        PyBuffer_Release(&v[--got]);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- random Fourier features (learner/policies/_fourier.py: FourierFeatures) -----------------
 *
 * phi's cosines were most of a Fourier member's learning: libm's cos costs ~14 ns a value here,
 * 1.8 ms of a 1,000-row batch of 128 features; these cost ~2 ns (AVX2) to 4 ns (SSE2). The
 * cosine is fdlibm's (Sun, public domain: k_sin.c, k_cos.c) in plain IEEE operations, lane by
 * lane, so _fourier.py's numpy copy of it (fourier_cos) gives the same bits, on any CPU:
 * Cody-Waite reduction by pi/2 in three parts (n * PIO2_1 and n * PIO2_2 exact for
 * |n| < 2^20), then the sine or cosine kernel on [-pi/4, pi/4] by quadrant. Its error is within
 * two ulps of libm's. Past COS_REDUCED (|t| ~ 823,550, rows far outside a z-scored range) it
 * is libm's cos. */

#define COS_REDUCED 823549.6
#define ROUNDER 6755399441055744.0 /* 1.5 * 2^52: v + ROUNDER - ROUNDER rounds v (|v| < 2^51) */
static const double INVPIO2 = 6.36619772367581382433e-01, PIO2_1 = 1.57079632673412561417e+00,
                    PIO2_2 = 6.07710050630396597660e-11, PIO2_2T = 2.02226624879595063154e-21;
static const double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03,
                    S3 = -1.98412698298579493134e-04, S4 = 2.75573137070700676789e-06,
                    S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;
static const double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03,
                    C3 = 2.48015872894767294178e-05, C4 = -2.75573143513906633035e-07,
                    C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;

/* fourier_cos on two (v2) or four (v4) values at once, the same operations on each lane, so the
 * same bits as one at a time: both kernels, then the quadrant n mod 4, the low bits of
 * shifted's mantissa, picks one and its sign by bits (a branch on a random quadrant would be
 * mispredicted half the time). */
typedef int64_t i2 __attribute__((vector_size(16)));
typedef int64_t i4 __attribute__((vector_size(32)));

#define FOURIER_COS(V, I)                                                                          \
    static inline __attribute__((always_inline)) V fourier_cos_##V(V t)                            \
    {                                                                                              \
        V shifted = t * INVPIO2 + ROUNDER, n = shifted - ROUNDER; /* rounded, ties to even */      \
        V x = ((t - n * PIO2_1) - n * PIO2_2) - n * PIO2_2T;                                       \
        V z = x * x, w = z * z;                                                                    \
        V sine = x + (z * x) * (S1 + z * (S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)))));           \
        V r = z * (C1 + z * (C2 + z * C3)) + w * w * (C4 + z * (C5 + z * C6));                     \
        V hz = 0.5 * z;                                                                            \
        w = 1.0 - hz;                                                                              \
        V cosine = w + (((1.0 - w) - hz) + z * r);                                                 \
        I q = (I)shifted, odd = -(q & 1);                                                          \
        return (V)((((I)sine & odd) | ((I)cosine & ~odd)) ^ (((q + 1) & 2) << 62));                \
    }

FOURIER_COS(v2, i2)
FOURIER_COS(v4, i4)

/* k rows of phi (see fourier()), four features at a time in the AVX2 copy, two otherwise; the
 * arguments past COS_REDUCED, which the reduction would get wrong, are redone with libm's cos. */
static inline __attribute__((always_inline)) void
fourier_rows(const double *I, const double *D, const double *C, double amplitude, double *O, Py_ssize_t k,
             Py_ssize_t n, int wide)
{
    for (Py_ssize_t i = 0; i < k; i++) {
        const double *inner = I + i * n, d = D[i];
        double *o = O + i * (n + 1);
        int far = 0;
        Py_ssize_t j = 0;
        o[0] = 1.0;
        if (wide)
            for (; j + 4 <= n; j += 4) {
                v4 t = load4(inner + j) / d + load4(C + j);
                i4 out = (t > COS_REDUCED) | (t < -COS_REDUCED) | (t != t);
                far |= (out[0] | out[1] | out[2] | out[3]) != 0;
                store4(o + 1 + j, fourier_cos_v4(t) * amplitude);
            }
        for (; j < n; j += 2) {
            v2 t = (j + 1 < n) ? load2(inner + j) / d + load2(C + j) : (v2){inner[j] / d + C[j], 0.0};
            far |= !(fabs(t[0]) <= COS_REDUCED) || !(fabs(t[1]) <= COS_REDUCED);
            v2 y = fourier_cos_v2(t) * amplitude;
            o[1 + j] = y[0];
            if (j + 1 < n)
                o[2 + j] = y[1];
        }
        for (j = 0; far && j < n; j++) {
            double t = inner[j] / d + C[j];
            if (!(fabs(t) <= COS_REDUCED))
                o[1 + j] = cos(t) * amplitude;
        }
    }
}

static void
fourier_narrow(const double *I, const double *D, const double *C, double amplitude, double *O, Py_ssize_t k, Py_ssize_t n)
{
    fourier_rows(I, D, C, amplitude, O, k, n, 0);
}

#ifdef HAVE_WIDE
__attribute__((target("avx2"))) static void
fourier_wide(const double *I, const double *D, const double *C, double amplitude, double *O, Py_ssize_t k, Py_ssize_t n)
{
    fourier_rows(I, D, C, amplitude, O, k, n, 1);
}
#else
#define fourier_wide fourier_narrow
#endif

PyDoc_STRVAR(fourier_doc,
"fourier(inner, denom, c, amplitude, out)\n\n"
"out[:, 0] = 1; out[i, 1 + j] = amplitude * cos(inner[i, j] / denom[i] + c[j]), the cosine\n"
"fdlibm's (learner/policies/_fourier.py's numpy fourier_cos gives the same bits).\n"
"inner (k, n), denom (k,), c (n,), out (k, n + 1): C-contiguous float64.");

static PyObject *
fourier(PyObject *module, PyObject *args)
{
    PyObject *o_inner, *o_denom, *o_c, *o_out;
    double amplitude;
    if (!PyArg_ParseTuple(args, "OOOdO:fourier", &o_inner, &o_denom, &o_c, &amplitude, &o_out))
        return NULL;
    Py_buffer inner, denom, c, out;
    int have_inner = 0, have_denom = 0, have_c = 0, have_out = 0, ok;
    ok = (have_inner = get_array(o_inner, &inner, 2, 'd', 0, "inner") == 0)
         && (have_denom = get_array(o_denom, &denom, 1, 'd', 0, "denom") == 0)
         && (have_c = get_array(o_c, &c, 1, 'd', 0, "c") == 0)
         && (have_out = get_array(o_out, &out, 2, 'd', 1, "out") == 0);
    if (ok) {
        Py_ssize_t k = inner.shape[0], n = inner.shape[1];
        if (denom.shape[0] != k || c.shape[0] != n || out.shape[0] != k || out.shape[1] != n + 1) {
            PyErr_SetString(PyExc_ValueError, "fourier: inner (k, n), denom (k,), c (n,) and out (k, n + 1) disagree");
            ok = 0;
        } else {
            int wide = WIDE;
            Py_BEGIN_ALLOW_THREADS
            (wide ? fourier_wide : fourier_narrow)(inner.buf, denom.buf, c.buf, amplitude, out.buf, k, n);
            Py_END_ALLOW_THREADS
        }
    }
    if (have_out)
        PyBuffer_Release(&out);
    if (have_c)
        PyBuffer_Release(&c);
    if (have_denom)
        PyBuffer_Release(&denom);
    if (have_inner)
        PyBuffer_Release(&inner);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- FeatureEncoder._hash_record ------------------------------------------------------------
 *
 * learner/features.py's Python loop, the same steps in the same order, over the same caches:
 * a digest found in the encoder's dicts is used as it is; a miss calls back into the encoder
 * (FeatureEncoder._numeric_key, FeatureEncoder._lookup), which hashes with BLAKE2b and fills and
 * bounds its caches, so the digests and the caches' contents are the Python path's. The
 * z-score reads the Normalizer's statistics and computes transform()'s expression with the
 * same operations (hence the same bits); whenever transform() would do anything but return a
 * number (an entry of another shape, a zero count or spread, where Python raises) or the
 * normaliser is of another class, transform() itself is called. */

/* The fields of features._HashPlan, by position. */
enum {
    PLAN_RECORD,      /* features._Record, the tuple subclass returned */
    PLAN_NORMALIZER,  /* features.Normalizer: its instances' statistics are read directly */
    PLAN_NS,          /* "c" or "a" */
    PLAN_NUMERIC,     /* dict: numeric name -> (normaliser name, digest, slot, sign) */
    PLAN_CACHE,       /* dict: key -> (digest, slot, sign) */
    PLAN_NUMERIC_KEY, /* (ns, name) -> the numeric entry, on a miss */
    PLAN_LOOKUP,      /* key -> the cache entry, on a miss */
    PLAN_CLIP,        /* float */
    PLAN_CATEGORICAL, /* key prefix of a categorical feature: ns SEP "c" SEP */
    PLAN_ID,          /* key prefix of the action id: ns SEP "id" SEP */
    PLAN_SEP,
    PLAN_VECTOR_H,    /* the dense vector's layout: digests, slots, signs (lists) */
    PLAN_VECTOR_SLOT,
    PLAN_VECTOR_SIGN,
    PLAN_WHAT,        /* "context" or "action", for error messages */
    PLAN_FIELDS
};

static PyObject *s_numeric, *s_categorical, *s_vector, *s_stats, *s_transform, *one;

/* f"{obj}" */
static PyObject *
as_text(PyObject *obj)
{
    if (PyUnicode_CheckExact(obj)) {
        Py_INCREF(obj);
        return obj;
    }
    return PyObject_Format(obj, NULL);
}

/* The concatenation of n strings. */
static PyObject *
concat(PyObject *const *parts, int n)
{
    Py_ssize_t length = 0;
    Py_UCS4 maxchar = 0;
    for (int i = 0; i < n; i++) {
        if (PyUnicode_READY(parts[i]) < 0)
            return NULL;
        length += PyUnicode_GET_LENGTH(parts[i]);
        if (PyUnicode_MAX_CHAR_VALUE(parts[i]) > maxchar)
            maxchar = PyUnicode_MAX_CHAR_VALUE(parts[i]);
    }
    PyObject *out = PyUnicode_New(length, maxchar);
    if (out == NULL)
        return NULL;
    Py_ssize_t at = 0;
    for (int i = 0; i < n; i++) {
        Py_ssize_t len = PyUnicode_GET_LENGTH(parts[i]);
        if (maxchar < 256) /* all one byte a character */
            memcpy(PyUnicode_1BYTE_DATA(out) + at, PyUnicode_1BYTE_DATA(parts[i]), len);
        else if (PyUnicode_CopyCharacters(out, at, parts[i], 0, len) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        at += len;
    }
    return out;
}

/* A cache entry: a tuple of n items, the last one the sign (a float). */
static int
check_entry(PyObject *entry, Py_ssize_t n)
{
    if (PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == n && PyFloat_CheckExact(PyTuple_GET_ITEM(entry, n - 1)))
        return 0;
    PyErr_Format(PyExc_TypeError, "a feature cache entry must be a tuple of %zd ending with a float sign", n);
    return -1;
}

/* Normalizer.transform(name, x, clip) as a new float; stats is the normaliser's dict when it
 * can be read directly, else NULL. */
static PyObject *
z_score(PyObject *normalizer, PyObject *stats, PyObject *name, PyObject *x_obj, PyObject *clip_obj)
{
    if (stats != NULL) {
        PyObject *stat = PyDict_GetItemWithError(stats, name);
        if (stat == NULL) {
            if (PyErr_Occurred())
                return NULL;
            return PyFloat_FromDouble(0.0);
        }
        if (PyList_CheckExact(stat) && PyList_GET_SIZE(stat) == 3 && PyFloat_CheckExact(PyList_GET_ITEM(stat, 0))
            && PyFloat_CheckExact(PyList_GET_ITEM(stat, 1)) && PyFloat_CheckExact(PyList_GET_ITEM(stat, 2))) {
            double count = PyFloat_AS_DOUBLE(PyList_GET_ITEM(stat, 0));
            double mean = PyFloat_AS_DOUBLE(PyList_GET_ITEM(stat, 1));
            double m2 = PyFloat_AS_DOUBLE(PyList_GET_ITEM(stat, 2));
            if (m2 <= 0.0)
                return PyFloat_FromDouble(0.0);
            double std = count > 0.0 ? sqrt(m2 / count) : 0.0;
            if (std != 0.0) { /* else Python divides by zero: let it raise */
                double clip = PyFloat_AS_DOUBLE(clip_obj);
                double z = (PyFloat_AS_DOUBLE(x_obj) - mean) / std;
                z = z < clip ? z : clip; /* max(-clip, min(clip, z)): a NaN z gives clip */
                return PyFloat_FromDouble(z > -clip ? z : -clip);
            }
        }
    }
    return PyObject_CallMethodObjArgs(normalizer, s_transform, name, x_obj, clip_obj, NULL);
}

/* Appends the dense vector's entries (FeatureEncoder._hash_record's last step). */
static int
hash_vector(PyObject *const *plan, PyObject *vector, PyObject *const *lists)
{
    Py_ssize_t n = PyObject_Length(vector);
    if (n <= 0)
        return (int)n;
    PyObject *layout_h = plan[PLAN_VECTOR_H], *layout_slot = plan[PLAN_VECTOR_SLOT], *layout_sign = plan[PLAN_VECTOR_SIGN];
    if (!PyList_CheckExact(layout_h) || !PyList_CheckExact(layout_slot) || !PyList_CheckExact(layout_sign)) {
        PyErr_SetString(PyExc_TypeError, "the vector layout must be lists");
        return -1;
    }
    Py_ssize_t m = PyList_GET_SIZE(layout_h);
    if (n != m) {
        PyErr_Format(PyExc_ValueError, "%U vector has %zd values, but the feature config expects %zd", plan[PLAN_WHAT], n, m);
        return -1;
    }
    PyObject *items = PySequence_List(vector); /* a copy: float() cannot change it under us */
    if (items == NULL)
        return -1;
    int rc = -1;
    PyObject *values = PyList_New(PyList_GET_SIZE(items)), *weights = NULL;
    if (values == NULL)
        goto done;
    Py_ssize_t k = PyList_GET_SIZE(values);
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *x = PyNumber_Float(PyList_GET_ITEM(items, i));
        if (x == NULL)
            goto done;
        PyList_SET_ITEM(values, i, x);
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (!isfinite(PyFloat_AS_DOUBLE(PyList_GET_ITEM(values, i)))) {
            PyErr_Format(PyExc_ValueError, "%U vector must be finite", plan[PLAN_WHAT]);
            goto done;
        }
    }
    if (k != m || PyList_GET_SIZE(layout_sign) != m) {
        PyErr_SetString(PyExc_RuntimeError, "vector changed size while read");
        goto done;
    }
    if ((weights = PyList_New(k)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < k; i++) {
        double g = PyFloat_AsDouble(PyList_GET_ITEM(layout_sign, i));
        if (g == -1.0 && PyErr_Occurred())
            goto done;
        PyObject *w = PyFloat_FromDouble(g * PyFloat_AS_DOUBLE(PyList_GET_ITEM(values, i)));
        if (w == NULL)
            goto done;
        PyList_SET_ITEM(weights, i, w);
    }
    PyObject *parts[4] = {layout_h, layout_slot, weights, values};
    for (int j = 0; j < 4; j++)
        if (PyList_SetSlice(lists[j], PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, parts[j]) < 0)
            goto done;
    rc = 0;
done:
    Py_XDECREF(weights);
    Py_XDECREF(values);
    Py_DECREF(items);
    return rc;
}

/* The optional dict `key` of features: 1 and *out (borrowed) if a dict or absent (NULL), 0 if
 * something else (the Python path decides what that means), -1 on error. */
static int
part_of(PyObject *features, PyObject *key, PyObject **out)
{
    *out = NULL;
    if (features == NULL)
        return 1;
    PyObject *part = PyDict_GetItemWithError(features, key);
    if (part == NULL)
        return PyErr_Occurred() ? -1 : 1;
    if (part == Py_None)
        return 1;
    if (!PyDict_CheckExact(part))
        return 0;
    *out = part;
    return 1;
}

PyDoc_STRVAR(hash_record_doc,
"hash_record(plan, features, action_id, normalizer) -> _Record or NotImplemented\n\n"
"FeatureEncoder._hash_record of one Features record under the encoder's plan for one namespace\n"
"(features._HashPlan); normalizer None: no z-scores. NotImplemented when the record or its\n"
"numeric or categorical part is neither None nor a dict: the Python path handles those.");

static PyObject *
hash_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "hash_record takes (plan, features, action_id, normalizer)");
        return NULL;
    }
    PyObject *plan_obj = args[0], *features = args[1], *action_id = args[2], *normalizer = args[3];
    if (!PyTuple_Check(plan_obj) || PyTuple_GET_SIZE(plan_obj) != PLAN_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "plan must be a features._HashPlan");
        return NULL;
    }
    PyObject *const *plan = &PyTuple_GET_ITEM(plan_obj, 0);
    PyTypeObject *record_type = (PyTypeObject *)plan[PLAN_RECORD];
    PyObject *numeric_keys = plan[PLAN_NUMERIC], *cache = plan[PLAN_CACHE], *clip = plan[PLAN_CLIP];
    if (!PyType_Check(plan[PLAN_RECORD]) || !PyType_IsSubtype(record_type, &PyTuple_Type) || !PyDict_CheckExact(numeric_keys)
        || !PyDict_CheckExact(cache) || !PyFloat_CheckExact(clip) || !PyUnicode_Check(plan[PLAN_CATEGORICAL])
        || !PyUnicode_Check(plan[PLAN_ID]) || !PyUnicode_Check(plan[PLAN_SEP])) {
        PyErr_SetString(PyExc_TypeError, "plan must be a features._HashPlan");
        return NULL;
    }
    if (features == Py_None)
        features = NULL;
    else if (!PyDict_CheckExact(features))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *numeric, *categorical, *vector = NULL;
    int ok = part_of(features, s_numeric, &numeric);
    if (ok == 1)
        ok = part_of(features, s_categorical, &categorical);
    if (ok < 0)
        return NULL;
    if (ok == 0)
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *stats = NULL;
    if (normalizer == Py_None)
        normalizer = NULL;
    else if (Py_IS_TYPE(normalizer, (PyTypeObject *)plan[PLAN_NORMALIZER])) {
        PyObject *held = PyObject_GetAttr(normalizer, s_stats);
        if (held == NULL)
            return NULL;
        if (PyDict_CheckExact(held))
            stats = held;
        else
            Py_DECREF(held);
    }

    Py_ssize_t n_numeric = numeric ? PyDict_GET_SIZE(numeric) : 0;
    Py_ssize_t n_categorical = categorical ? PyDict_GET_SIZE(categorical) : 0;
    Py_ssize_t n = n_numeric + n_categorical + (action_id != Py_None);
    PyObject *lists[4] = {PyList_New(n), PyList_New(n), PyList_New(n), PyList_New(n)}; /* h, slot, weight, value */
    PyObject *record = NULL, *key = NULL, *value = NULL;
    if (!lists[0] || !lists[1] || !lists[2] || !lists[3])
        goto done;
    Py_ssize_t t = 0, pos = 0;
    PyObject *name, *x_obj, *entry;

    /* numeric: float(x), finite, the cached key, the z-score */
    while (numeric != NULL && PyDict_Next(numeric, &pos, &name, &x_obj)) {
        if (t >= n_numeric)
            break;
        PyObject *x = PyNumber_Float(x_obj);
        if (x == NULL)
            goto done;
        if (!isfinite(PyFloat_AS_DOUBLE(x))) {
            PyErr_Format(PyExc_ValueError, "numeric feature %R is %S; features must be finite", name, x);
            Py_DECREF(x);
            goto done;
        }
        entry = PyDict_GetItemWithError(numeric_keys, name);
        if (entry != NULL)
            Py_INCREF(entry);
        else if (!PyErr_Occurred())
            entry = PyObject_CallFunctionObjArgs(plan[PLAN_NUMERIC_KEY], plan[PLAN_NS], name, NULL);
        if (entry == NULL || check_entry(entry, 4) < 0) {
            Py_XDECREF(entry);
            Py_DECREF(x);
            goto done;
        }
        value = normalizer ? z_score(normalizer, stats, PyTuple_GET_ITEM(entry, 0), x, clip) : (Py_INCREF(x), x);
        Py_DECREF(x);
        PyObject *sign = PyTuple_GET_ITEM(entry, 3), *weight;
        if (value == NULL)
            weight = NULL;
        else if (!PyFloat_CheckExact(value))
            weight = PyNumber_Multiply(sign, value);
        else if (PyFloat_AS_DOUBLE(sign) == 1.0) /* 1.0 * x is x, bit for bit */
            weight = (Py_INCREF(value), value);
        else
            weight = PyFloat_FromDouble(PyFloat_AS_DOUBLE(sign) * PyFloat_AS_DOUBLE(value));
        if (weight == NULL) {
            Py_DECREF(entry);
            goto done;
        }
        Py_INCREF(PyTuple_GET_ITEM(entry, 1));
        Py_INCREF(PyTuple_GET_ITEM(entry, 2));
        PyList_SET_ITEM(lists[0], t, PyTuple_GET_ITEM(entry, 1));
        PyList_SET_ITEM(lists[1], t, PyTuple_GET_ITEM(entry, 2));
        PyList_SET_ITEM(lists[2], t, weight);
        PyList_SET_ITEM(lists[3], t, value);
        value = NULL;
        Py_DECREF(entry);
        t++;
    }
    if (t != n_numeric || (numeric && PyDict_GET_SIZE(numeric) != n_numeric)) {
        PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during iteration");
        goto done;
    }

    /* categorical (value 1): ns SEP c SEP name SEP value, then ns SEP id SEP action_id */
    pos = 0;
    for (;;) {
        if (categorical != NULL && PyDict_Next(categorical, &pos, &name, &x_obj)) {
            if (t >= n_numeric + n_categorical)
                break;
            PyObject *name_text = as_text(name), *value_text = name_text ? as_text(x_obj) : NULL;
            if (value_text != NULL) {
                PyObject *parts[4] = {plan[PLAN_CATEGORICAL], name_text, plan[PLAN_SEP], value_text};
                key = concat(parts, 4);
            }
            Py_XDECREF(name_text);
            Py_XDECREF(value_text);
        }
        else if (t == n_numeric + n_categorical && action_id != Py_None) {
            PyObject *id_text = as_text(action_id);
            if (id_text != NULL) {
                PyObject *parts[2] = {plan[PLAN_ID], id_text};
                key = concat(parts, 2);
                Py_DECREF(id_text);
            }
        }
        else
            break;
        if (key == NULL)
            goto done;
        entry = PyDict_GetItemWithError(cache, key);
        if (entry != NULL)
            Py_INCREF(entry);
        else if (!PyErr_Occurred())
            entry = PyObject_CallOneArg(plan[PLAN_LOOKUP], key);
        Py_CLEAR(key);
        if (entry == NULL || check_entry(entry, 3) < 0) {
            Py_XDECREF(entry);
            goto done;
        }
        for (int j = 0; j < 3; j++) {
            Py_INCREF(PyTuple_GET_ITEM(entry, j));
            PyList_SET_ITEM(lists[j], t, PyTuple_GET_ITEM(entry, j));
        }
        Py_INCREF(one);
        PyList_SET_ITEM(lists[3], t, one);
        Py_DECREF(entry);
        t++;
    }
    if (t != n || (categorical && PyDict_GET_SIZE(categorical) != n_categorical)) {
        PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during iteration");
        goto done;
    }

    if (features != NULL && (vector = PyDict_GetItemWithError(features, s_vector)) == NULL && PyErr_Occurred())
        goto done;
    if (vector != NULL && vector != Py_None && hash_vector(plan, vector, lists) < 0)
        goto done;

    if ((record = record_type->tp_alloc(record_type, 4)) == NULL)
        goto done;
    for (int j = 0; j < 4; j++) {
        PyTuple_SET_ITEM(record, j, lists[j]);
        lists[j] = NULL;
    }
done:
    for (int j = 0; j < 4; j++)
        Py_XDECREF(lists[j]);
    Py_XDECREF(value);
    Py_XDECREF(stats);
    return record;
}

/* ---- FeatureEncoder._assemble ----------------------------------------------------------------
 *
 * The numpy path concatenates every row's slots and weights (contexts, then actions, then the
 * interaction products) and sums them with one bincount, which adds in array order: a row's
 * coordinate is 0.0 + its context terms + its action terms + its products, each group in record
 * order. Here each row is summed in that order directly, the products hashed as numpy does
 * (uint64 arithmetic wraps alike) and weighted (sign * c) * a, numpy's order. */

static inline uint64_t
splitmix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* One record's lists (features._Record: h, slot, weight, value), borrowed and checked. */
typedef struct {
    PyObject *h, *slot, *weight, *value;
    Py_ssize_t n;
} Rec;

static int
get_rec(PyObject *obj, Rec *rec)
{
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 4)
        goto bad;
    rec->h = PyTuple_GET_ITEM(obj, 0);
    rec->slot = PyTuple_GET_ITEM(obj, 1);
    rec->weight = PyTuple_GET_ITEM(obj, 2);
    rec->value = PyTuple_GET_ITEM(obj, 3);
    if (!PyList_Check(rec->h) || !PyList_Check(rec->slot) || !PyList_Check(rec->weight) || !PyList_Check(rec->value))
        goto bad;
    rec->n = PyList_GET_SIZE(rec->slot);
    if (PyList_GET_SIZE(rec->h) != rec->n || PyList_GET_SIZE(rec->weight) != rec->n || PyList_GET_SIZE(rec->value) != rec->n)
        goto bad;
    return 0;
bad:
    PyErr_SetString(PyExc_TypeError, "a row must pair features._Record of aligned lists");
    return -1;
}

/* row[slot] += weight over the record's terms, in order */
static int
add_terms(double *row, Py_ssize_t d, const Rec *rec)
{
    for (Py_ssize_t t = 0; t < rec->n; t++) {
        Py_ssize_t slot = PyLong_AsSsize_t(PyList_GET_ITEM(rec->slot, t));
        double w = PyFloat_AsDouble(PyList_GET_ITEM(rec->weight, t));
        if (PyErr_Occurred())
            return -1;
        if (slot < 0 || slot >= d) {
            PyErr_Format(PyExc_IndexError, "slot %zd out of range for dimension %zd", slot, d);
            return -1;
        }
        row[slot] += w;
    }
    return 0;
}

/* digests and values of a record into h, v (room for rec->n each) */
static int
read_hv(const Rec *rec, uint64_t *h, double *v)
{
    for (Py_ssize_t t = 0; t < rec->n; t++) {
        h[t] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(rec->h, t));
        v[t] = PyFloat_AsDouble(PyList_GET_ITEM(rec->value, t));
    }
    return PyErr_Occurred() ? -1 : 0;
}

PyDoc_STRVAR(assemble_doc,
"assemble(out, rows, interactions, offset, m, intercept)\n\n"
"FeatureEncoder._assemble into out (n, d), all zeros: row i from rows[i] = (context record,\n"
"action record or None), the products hashed to offset + splitmix64(h_c * phi ^ h_a) mod m;\n"
"then coordinate 0 set to 1.0 if intercept.");

static PyObject *
assemble(PyObject *module, PyObject *args)
{
    PyObject *out_obj, *rows_obj;
    int interactions, intercept;
    Py_ssize_t offset, m;
    if (!PyArg_ParseTuple(args, "OOpnnp:assemble", &out_obj, &rows_obj, &interactions, &offset, &m, &intercept))
        return NULL;
    if (m < 1 || offset < 0) {
        PyErr_SetString(PyExc_ValueError, "need m >= 1 and offset >= 0");
        return NULL;
    }
    Py_buffer out;
    if (get_array(out_obj, &out, 2, 'd', 1, "out") < 0)
        return NULL;
    PyObject *rows = PySequence_Fast(rows_obj, "rows must be a sequence");
    uint64_t *h = NULL;
    double *v = NULL;
    Py_ssize_t room = 0, n = out.shape[0], d = out.shape[1];
    int ok = rows != NULL;
    if (ok && PySequence_Fast_GET_SIZE(rows) != n) {
        PyErr_SetString(PyExc_ValueError, "out needs one row per pair");
        ok = 0;
    }
    if (ok && offset + m > d) {
        PyErr_SetString(PyExc_ValueError, "offset + m must not exceed the dimension");
        ok = 0;
    }
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(rows, i);
        Rec ctx, act;
        double *row = (double *)out.buf + i * d;
        ok = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2;
        if (!ok) {
            PyErr_SetString(PyExc_TypeError, "rows must be (context record, action record or None) pairs");
            break;
        }
        int has_act = PyTuple_GET_ITEM(pair, 1) != Py_None;
        ok = get_rec(PyTuple_GET_ITEM(pair, 0), &ctx) == 0 && (!has_act || get_rec(PyTuple_GET_ITEM(pair, 1), &act) == 0)
             && add_terms(row, d, &ctx) == 0 && (!has_act || add_terms(row, d, &act) == 0);
        if (ok && interactions && has_act && ctx.n > 0 && act.n > 0) {
            if (ctx.n + act.n > room) {
                room = 2 * (ctx.n + act.n);
                PyMem_Free(h);
                h = PyMem_Malloc(room * (sizeof(uint64_t) + sizeof(double)));
                v = (double *)(h + room);
                if (h == NULL) {
                    PyErr_NoMemory();
                    ok = 0;
                    break;
                }
            }
            uint64_t *ch = h, *ah = h + ctx.n;
            double *cv = v, *av = v + ctx.n;
            ok = read_hv(&ctx, ch, cv) == 0 && read_hv(&act, ah, av) == 0;
            for (Py_ssize_t j = 0; ok && j < ctx.n; j++) {
                uint64_t hc = ch[j] * 0x9E3779B97F4A7C15ULL;
                for (Py_ssize_t k = 0; k < act.n; k++) {
                    uint64_t mixed = splitmix64(hc ^ ah[k]);
                    double sign = 1.0 - 2.0 * (double)(mixed >> 63);
                    double w = sign * cv[j];
                    row[offset + (Py_ssize_t)(mixed % (uint64_t)m)] += w * av[k];
                }
            }
        }
        if (ok && intercept && d > 0)
            row[0] = 1.0;
    }
    PyMem_Free(h);
    Py_XDECREF(rows);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"mean_width", mean_width, METH_VARARGS, mean_width_doc},
    {"choose", choose, METH_VARARGS, choose_doc},
    {"repeated_row", repeated_row, METH_VARARGS, repeated_row_doc},
    {"all_finite", all_finite, METH_O, all_finite_doc},
    {"rank_one", rank_one, METH_VARARGS, rank_one_doc},
    {"add_outer", add_outer, METH_VARARGS, add_outer_doc},
    {"hash_record", (PyCFunction)(void (*)(void))hash_record, METH_FASTCALL, hash_record_doc},
    {"assemble", assemble, METH_VARARGS, assemble_doc},
    {"detect", detect, METH_VARARGS, detect_doc},
    {"fourier", fourier, METH_VARARGS, fourier_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "learner._fastscore",
    "The SDK's decision step compiled (linear scores, draws, floor, choice; candidate rows of\n"
    "per-arm models), the shared models' rank-one updates, the per-arm models' change detector,\n"
    "random Fourier features and the feature encoding's hashing and summing; see\n"
    "learner/_fastscore.c.", -1, methods,
};

PyMODINIT_FUNC
PyInit__fastscore(void)
{
    if (!(s_numeric = PyUnicode_InternFromString("numeric")) || !(s_categorical = PyUnicode_InternFromString("categorical"))
        || !(s_vector = PyUnicode_InternFromString("vector")) || !(s_stats = PyUnicode_InternFromString("_stats"))
        || !(s_transform = PyUnicode_InternFromString("transform")) || !(one = PyFloat_FromDouble(1.0)))
        return NULL;
    return PyModule_Create(&module);
}
