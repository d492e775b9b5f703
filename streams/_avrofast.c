/* Compiled Avro binary reader and writer for banditstream's schemas.
 *
 * streams/_avrocodec.py walks a (writer schema, reader schema) pair once, with Avro schema
 * resolution applied (skipped writer fields, reader defaults, promotions, enum symbols
 * mapped to the reader's strings, union branches matched), and hands the result here as a
 * small tree of tuples: the program. Reader(program, ...) turns it into C nodes once;
 * Reader.decode then walks those nodes over the bytes and builds the Python values
 * directly: dicts keyed by pre-made field-name strings, floats from little-endian bytes,
 * ints from zig-zag varints, strings through a small per-reader cache (feature names and
 * categorical values repeat in every event, so most strings are an incref, not a decode).
 * Writer does the same for encoding one schema.
 *
 * The conventions are those of the generated Python in _avrocodec.py, which stays the
 * fallback when this module is not built:
 *
 *   - every read is checked against the end of the buffer; data that ends early raises the
 *     reader's `truncated` class (an IndexError subclass);
 *   - bytes that cannot be Avro of the writer schema (bad union or enum index, negative
 *     length, boolean byte other than 0/1, varint over 10 bytes or 64 bits, invalid UTF-8)
 *     raise `corrupt`;
 *   - a value the reader schema has no place for (a writer union branch or enum symbol the
 *     reader lacks) raises `incompatible`;
 *   - the writer raises TypeError, KeyError, ValueError or OverflowError for any value it
 *     does not take as-is; the caller then hands the record to fastavro.
 *
 * Recursion is over the schema, never over the data, and schemas are limited to
 * MAX_DEPTH levels, so no input can exhaust the C stack. Loops over data consume at least
 * one byte per iteration except for arrays of zero-width items, which are capped.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 100
/* Arrays whose items take no bytes (null, empty records) could claim 2^63 items in one
 * varint; refuse more than this many rather than loop. */
#define MAX_ZERO_WIDTH_ITEMS (1 << 20)
/* The string cache: direct-mapped, keyed by the UTF-8 bytes of strings up to this long. */
#define STR_CACHE_SLOTS 1024
#define STR_CACHE_MAX_LEN 32
#define STACK_ITEMS 32
#define STACK_SLOTS 24

enum Op {
    OP_NULL,
    OP_BOOLEAN,
    OP_INT,    /* writer: 32-bit range checked; reader: same as OP_LONG */
    OP_LONG,
    OP_LONG_AS_DOUBLE,
    OP_FLOAT,
    OP_DOUBLE,
    OP_STRING,
    OP_BYTES,
    OP_FIXED,
    OP_ENUM,
    OP_UNION,
    OP_OPTIONAL, /* writer only: [null, T] or [T, null] */
    OP_ARRAY,
    OP_MAP,
    OP_RECORD,
};

static const struct {
    const char *name;
    int op;
} PRIMITIVE_OPS[] = {
    {"null", OP_NULL},         {"boolean", OP_BOOLEAN},
    {"int", OP_INT},           {"long", OP_LONG},
    {"long_as_double", OP_LONG_AS_DOUBLE},
    {"float", OP_FLOAT},       {"double", OP_DOUBLE},
    {"string", OP_STRING},     {"bytes", OP_BYTES},
};

typedef struct Node Node;

typedef struct {
    Py_ssize_t slot; /* reader field index the value goes to; -1: read and dropped */
    Node *node;
} Step;

typedef struct {
    PyObject *key;     /* field name (interned str) */
    Py_ssize_t slot;   /* reader: index into the steps' slots, -1 for the default */
    PyObject *dflt;    /* reader: default value (copied per record); writer: encoded bytes or NULL */
    Node *node;        /* writer: the field's type */
} Field;

struct Node {
    int op;
    Py_ssize_t min_size;   /* fewest bytes a value of this type takes in the writer's data */
    Py_ssize_t size;       /* fixed: its size; optional: index of the null branch */
    PyObject *name;        /* enum: full name, for messages */
    PyObject *symbols;     /* reader enum: tuple of str, None where unknown to the reader;
                              writer enum: dict str -> encoded index (bytes) */
    Py_ssize_t nbranches;
    Node **branches;       /* union: NULL where the reader has no matching branch */
    Node *item;            /* array items, map values, optional's non-null branch */
    Py_ssize_t nsteps;
    Step *steps;
    Py_ssize_t nfields;
    Field *fields;
    /* Record read in order: steps fill fields 0..nsteps-1, the rest are defaults. */
    int in_order;
};

/* ---------------------------------------------------------------------------------------
 * Nodes: built from the program tuples, freed with their owner. */

static void
node_free(Node *nd)
{
    if (nd == NULL) {
        return;
    }
    Py_XDECREF(nd->name);
    Py_XDECREF(nd->symbols);
    if (nd->branches != NULL) {
        for (Py_ssize_t i = 0; i < nd->nbranches; i++) {
            node_free(nd->branches[i]);
        }
        PyMem_Free(nd->branches);
    }
    node_free(nd->item);
    if (nd->steps != NULL) {
        for (Py_ssize_t i = 0; i < nd->nsteps; i++) {
            node_free(nd->steps[i].node);
        }
        PyMem_Free(nd->steps);
    }
    if (nd->fields != NULL) {
        for (Py_ssize_t i = 0; i < nd->nfields; i++) {
            Py_XDECREF(nd->fields[i].key);
            Py_XDECREF(nd->fields[i].dflt);
            node_free(nd->fields[i].node);
        }
        PyMem_Free(nd->fields);
    }
    PyMem_Free(nd);
}

static Node *
node_new(int op)
{
    Node *nd = PyMem_Calloc(1, sizeof(Node));
    if (nd == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    nd->op = op;
    return nd;
}

static int
bad_program(const char *what, PyObject *spec)
{
    PyErr_Format(PyExc_ValueError, "malformed program: %s in %R", what, spec);
    return -1;
}

static int
tuple_args(PyObject *spec, Py_ssize_t n, const char *op)
{
    if (PyTuple_GET_SIZE(spec) != n) {
        PyErr_Format(PyExc_ValueError, "malformed program: %s takes %zd items, not %zd", op, n,
                     PyTuple_GET_SIZE(spec));
        return -1;
    }
    return 0;
}

static Py_ssize_t
sat_add(Py_ssize_t a, Py_ssize_t b)
{
    return a > PY_SSIZE_T_MAX - b ? PY_SSIZE_T_MAX : a + b;
}

static Node *build_node(PyObject *spec, int writer, int depth);

static int
build_record_reader(Node *nd, PyObject *spec, int depth)
{
    /* ("record", steps, fields): steps = ((slot, node), ...) in writer order;
     * fields = ((name, slot, default), ...) in reader order, slot -1 for a default. */
    if (tuple_args(spec, 3, "record") < 0) {
        return -1;
    }
    PyObject *steps = PyTuple_GET_ITEM(spec, 1), *fields = PyTuple_GET_ITEM(spec, 2);
    if (!PyTuple_Check(steps) || !PyTuple_Check(fields)) {
        return bad_program("record steps and fields must be tuples", spec);
    }
    nd->nsteps = PyTuple_GET_SIZE(steps);
    nd->nfields = PyTuple_GET_SIZE(fields);
    nd->steps = PyMem_Calloc(nd->nsteps ? nd->nsteps : 1, sizeof(Step));
    nd->fields = PyMem_Calloc(nd->nfields ? nd->nfields : 1, sizeof(Field));
    char *filled = PyMem_Calloc(nd->nfields ? nd->nfields : 1, 1);
    if (nd->steps == NULL || nd->fields == NULL || filled == NULL) {
        PyMem_Free(filled);
        PyErr_NoMemory();
        return -1;
    }
    int ok = -1;
    nd->in_order = 1;
    for (Py_ssize_t i = 0; i < nd->nsteps; i++) {
        PyObject *step = PyTuple_GET_ITEM(steps, i);
        if (!PyTuple_Check(step) || PyTuple_GET_SIZE(step) != 2) {
            bad_program("a record step must be (slot, node)", step);
            goto done;
        }
        Py_ssize_t slot = PyLong_AsSsize_t(PyTuple_GET_ITEM(step, 0));
        if (slot == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (slot < -1 || slot >= nd->nfields || (slot >= 0 && filled[slot])) {
            bad_program("record step slot out of range or repeated", step);
            goto done;
        }
        if (slot >= 0) {
            filled[slot] = 1;
        }
        nd->steps[i].slot = slot;
        if (slot != i) {
            nd->in_order = 0;
        }
        nd->steps[i].node = build_node(PyTuple_GET_ITEM(step, 1), 0, depth + 1);
        if (nd->steps[i].node == NULL) {
            goto done;
        }
        nd->min_size = sat_add(nd->min_size, nd->steps[i].node->min_size);
    }
    for (Py_ssize_t i = 0; i < nd->nfields; i++) {
        PyObject *field = PyTuple_GET_ITEM(fields, i);
        if (!PyTuple_Check(field) || PyTuple_GET_SIZE(field) != 3 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(field, 0))) {
            bad_program("a record field must be (name, slot, default)", field);
            goto done;
        }
        Py_ssize_t slot = PyLong_AsSsize_t(PyTuple_GET_ITEM(field, 1));
        if (slot == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (slot != i && slot != -1) {
            bad_program("field slot must be its own index or -1", field);
            goto done;
        }
        if ((slot >= 0) != (filled[i] != 0)) {
            bad_program("a field is read by exactly one step or has a default", field);
            goto done;
        }
        PyObject *key = PyTuple_GET_ITEM(field, 0);
        Py_INCREF(key);
        PyUnicode_InternInPlace(&key);
        nd->fields[i].key = key;
        nd->fields[i].slot = slot;
        if (slot < 0) {
            nd->fields[i].dflt = Py_NewRef(PyTuple_GET_ITEM(field, 2));
            if (i < nd->nsteps) {
                nd->in_order = 0;
            }
        }
    }
    if (nd->nsteps > nd->nfields) {
        nd->in_order = 0;
    }
    ok = 0;
done:
    PyMem_Free(filled);
    return ok;
}

static int
build_record_writer(Node *nd, PyObject *spec, int depth)
{
    /* ("record", ((name, node, default bytes or None), ...)) */
    if (tuple_args(spec, 2, "record") < 0) {
        return -1;
    }
    PyObject *fields = PyTuple_GET_ITEM(spec, 1);
    if (!PyTuple_Check(fields)) {
        return bad_program("record fields must be a tuple", spec);
    }
    nd->nfields = PyTuple_GET_SIZE(fields);
    nd->fields = PyMem_Calloc(nd->nfields ? nd->nfields : 1, sizeof(Field));
    if (nd->fields == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < nd->nfields; i++) {
        PyObject *field = PyTuple_GET_ITEM(fields, i);
        if (!PyTuple_Check(field) || PyTuple_GET_SIZE(field) != 3 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(field, 0))) {
            return bad_program("a record field must be (name, node, default)", field);
        }
        PyObject *key = Py_NewRef(PyTuple_GET_ITEM(field, 0));
        PyUnicode_InternInPlace(&key);
        nd->fields[i].key = key;
        nd->fields[i].slot = i;
        PyObject *dflt = PyTuple_GET_ITEM(field, 2);
        if (dflt != Py_None) {
            if (!PyBytes_CheckExact(dflt)) {
                return bad_program("a writer default must be bytes or None", field);
            }
            nd->fields[i].dflt = Py_NewRef(dflt);
        }
        nd->fields[i].node = build_node(PyTuple_GET_ITEM(field, 1), 1, depth + 1);
        if (nd->fields[i].node == NULL) {
            return -1;
        }
    }
    return 0;
}

static Node *
build_node(PyObject *spec, int writer, int depth)
{
    if (depth > MAX_DEPTH) {
        PyErr_Format(PyExc_ValueError, "schema nested deeper than %d levels", MAX_DEPTH);
        return NULL;
    }
    if (PyUnicode_Check(spec)) {
        for (size_t i = 0; i < sizeof(PRIMITIVE_OPS) / sizeof(PRIMITIVE_OPS[0]); i++) {
            if (PyUnicode_CompareWithASCIIString(spec, PRIMITIVE_OPS[i].name) == 0) {
                int op = PRIMITIVE_OPS[i].op;
                if (writer && op == OP_LONG_AS_DOUBLE) {
                    break;
                }
                Node *nd = node_new(op);
                if (nd != NULL) {
                    nd->min_size = op == OP_NULL ? 0 : op == OP_FLOAT ? 4 : op == OP_DOUBLE ? 8 : 1;
                }
                return nd;
            }
        }
        bad_program("unknown primitive", spec);
        return NULL;
    }
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 2 || !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0))) {
        bad_program("a node is a primitive name or (kind, ...)", spec);
        return NULL;
    }
    PyObject *kind = PyTuple_GET_ITEM(spec, 0);
    Node *nd = NULL;
    if (PyUnicode_CompareWithASCIIString(kind, "fixed") == 0) {
        if (tuple_args(spec, 2, "fixed") < 0 || (nd = node_new(OP_FIXED)) == NULL) {
            goto fail;
        }
        nd->size = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 1));
        if (nd->size < 0) {
            if (!PyErr_Occurred()) {
                bad_program("fixed size must be >= 0", spec);
            }
            goto fail;
        }
        nd->min_size = nd->size;
    }
    else if (PyUnicode_CompareWithASCIIString(kind, "enum") == 0) {
        /* reader: ("enum", name, (symbol or None, ...)); writer: ("enum", name, {symbol: bytes}) */
        if (tuple_args(spec, 3, "enum") < 0 || (nd = node_new(OP_ENUM)) == NULL) {
            goto fail;
        }
        PyObject *symbols = PyTuple_GET_ITEM(spec, 2);
        if (writer ? !PyDict_CheckExact(symbols) : !PyTuple_CheckExact(symbols)) {
            bad_program("enum symbols", spec);
            goto fail;
        }
        if (!writer) {
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(symbols); i++) {
                PyObject *s = PyTuple_GET_ITEM(symbols, i);
                if (s != Py_None && !PyUnicode_CheckExact(s)) {
                    bad_program("an enum symbol must be str or None", spec);
                    goto fail;
                }
            }
        }
        else {
            PyObject *k, *v;
            Py_ssize_t pos = 0;
            while (PyDict_Next(symbols, &pos, &k, &v)) {
                if (!PyBytes_CheckExact(v)) {
                    bad_program("an enum index must be encoded bytes", spec);
                    goto fail;
                }
            }
        }
        nd->name = Py_NewRef(PyTuple_GET_ITEM(spec, 1));
        nd->symbols = Py_NewRef(symbols);
        nd->min_size = 1;
    }
    else if (PyUnicode_CompareWithASCIIString(kind, "union") == 0 && !writer) {
        /* ("union", (node or None, ...)): one per writer branch, None where the reader has no match */
        if (tuple_args(spec, 2, "union") < 0 || (nd = node_new(OP_UNION)) == NULL) {
            goto fail;
        }
        PyObject *branches = PyTuple_GET_ITEM(spec, 1);
        if (!PyTuple_Check(branches)) {
            bad_program("union branches must be a tuple", spec);
            goto fail;
        }
        nd->nbranches = PyTuple_GET_SIZE(branches);
        nd->branches = PyMem_Calloc(nd->nbranches ? nd->nbranches : 1, sizeof(Node *));
        if (nd->branches == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t i = 0; i < nd->nbranches; i++) {
            PyObject *b = PyTuple_GET_ITEM(branches, i);
            if (b != Py_None && (nd->branches[i] = build_node(b, 0, depth + 1)) == NULL) {
                goto fail;
            }
        }
        nd->min_size = 1;
    }
    else if (PyUnicode_CompareWithASCIIString(kind, "optional") == 0 && writer) {
        /* ("optional", null index, node) */
        if (tuple_args(spec, 3, "optional") < 0 || (nd = node_new(OP_OPTIONAL)) == NULL) {
            goto fail;
        }
        nd->size = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 1));
        if (nd->size != 0 && nd->size != 1) {
            if (!PyErr_Occurred()) {
                bad_program("optional null index must be 0 or 1", spec);
            }
            goto fail;
        }
        if ((nd->item = build_node(PyTuple_GET_ITEM(spec, 2), 1, depth + 1)) == NULL) {
            goto fail;
        }
        nd->min_size = 1;
    }
    else if (PyUnicode_CompareWithASCIIString(kind, "array") == 0 ||
             PyUnicode_CompareWithASCIIString(kind, "map") == 0) {
        int is_map = PyUnicode_CompareWithASCIIString(kind, "map") == 0;
        if (tuple_args(spec, 2, is_map ? "map" : "array") < 0 ||
            (nd = node_new(is_map ? OP_MAP : OP_ARRAY)) == NULL) {
            goto fail;
        }
        if ((nd->item = build_node(PyTuple_GET_ITEM(spec, 1), writer, depth + 1)) == NULL) {
            goto fail;
        }
        nd->min_size = 1;
    }
    else if (PyUnicode_CompareWithASCIIString(kind, "record") == 0) {
        if ((nd = node_new(OP_RECORD)) == NULL) {
            goto fail;
        }
        if ((writer ? build_record_writer(nd, spec, depth) : build_record_reader(nd, spec, depth)) < 0) {
            goto fail;
        }
    }
    else {
        bad_program(writer ? "unknown writer node" : "unknown reader node", spec);
        goto fail;
    }
    return nd;
fail:
    node_free(nd);
    return NULL;
}

/* ---------------------------------------------------------------------------------------
 * Reader */

typedef struct {
    PyObject *str;
    Py_ssize_t len;
    unsigned char bytes[STR_CACHE_MAX_LEN];
} CacheEntry;

typedef struct {
    PyObject_HEAD
    Node *root;
    PyObject *truncated;
    PyObject *corrupt;
    PyObject *incompatible;
    CacheEntry *cache;
} ReaderObject;

typedef struct {
    const unsigned char *start;
    const unsigned char *p;
    const unsigned char *end;
    ReaderObject *rd;
} Cursor;

static int
truncated(Cursor *c, const char *what)
{
    PyErr_Format(c->rd->truncated, "the data (%zd bytes) ends inside %s", (Py_ssize_t)(c->end - c->start), what);
    return -1;
}

#define OFFSET(c, ptr) ((Py_ssize_t)((ptr) - (c)->start))

static int
read_long_slow(Cursor *c, int64_t *out)
{
    const unsigned char *p = c->p;
    uint64_t b = *p++;
    uint64_t n = b & 0x7F;
    int shift = 7;
    while (b & 0x80) {
        if (shift > 63) {
            PyErr_Format(c->rd->corrupt, "varint longer than 10 bytes at offset %zd", OFFSET(c, p));
            return -1;
        }
        if (p >= c->end) {
            return truncated(c, "a varint");
        }
        b = *p++;
        if (shift == 63 && b > 1 && !(b & 0x80)) {
            PyErr_Format(c->rd->corrupt, "varint overflows 64 bits at offset %zd", OFFSET(c, p - 10));
            return -1;
        }
        n |= (b & 0x7F) << shift;
        shift += 7;
    }
    c->p = p;
    *out = (int64_t)((n >> 1) ^ (0 - (n & 1)));
    return 0;
}

static inline int
read_long(Cursor *c, int64_t *out)
{
    if (c->p >= c->end) {
        return truncated(c, "a varint");
    }
    unsigned int b = *c->p;
    if (b < 0x80) {
        c->p++;
        *out = (int64_t)(b >> 1) ^ -(int64_t)(b & 1);
        return 0;
    }
    return read_long_slow(c, out);
}

/* A length prefix: the bytes that follow are checked to be there. */
static inline int
read_length(Cursor *c, Py_ssize_t *out, const char *what)
{
    const unsigned char *at = c->p;
    int64_t n;
    if (read_long(c, &n) < 0) {
        return -1;
    }
    if (n < 0) {
        PyErr_Format(c->rd->corrupt, "negative length %lld at offset %zd", (long long)n, OFFSET(c, at));
        return -1;
    }
    if ((uint64_t)n > (uint64_t)(c->end - c->p)) {
        return truncated(c, what);
    }
    *out = (Py_ssize_t)n;
    return 0;
}

/* A block count of an array or map; a negative count is followed by the block's size in
 * bytes, which is not needed. Returns the count as unsigned (-INT64_MIN does not fit). */
static inline int
read_count(Cursor *c, uint64_t *out)
{
    int64_t n;
    if (read_long(c, &n) < 0) {
        return -1;
    }
    if (n < 0) {
        int64_t size;
        *out = (uint64_t)0 - (uint64_t)n;
        return read_long(c, &size);
    }
    *out = (uint64_t)n;
    return 0;
}

/* A hash of 1..STR_CACHE_MAX_LEN bytes for the cache slot: whole words, the tail read as
 * an overlapping word (or halves, for short strings) so it never reads past the string. */
static inline uint64_t
hash_bytes(const unsigned char *p, Py_ssize_t n)
{
    uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ull, w;
    if (n >= 8) {
        const unsigned char *last = p + n - 8;
        while (p < last) {
            memcpy(&w, p, 8);
            h = (h ^ w) * 0xFF51AFD7ED558CCDull;
            h ^= h >> 29;
            p += 8;
        }
        memcpy(&w, last, 8);
    }
    else if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + n - 4, 4);
        w = ((uint64_t)a << 32) | b;
    }
    else {
        w = ((uint64_t)p[0] << 16) | ((uint64_t)p[n >> 1] << 8) | p[n - 1];
    }
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 32);
}

static inline double
load_double(const unsigned char *p)
{
#if PY_LITTLE_ENDIAN
    double d;
    memcpy(&d, p, 8);
    return d;
#else
    return PyFloat_Unpack8((const char *)p, 1);
#endif
}

/* A dict for n entries. Presizing skips the resizes while they go in; the call is CPython's
 * own (exported, not limited API), so newer versions fall back to growing. */
static inline PyObject *
new_dict(Py_ssize_t n)
{
#if PY_VERSION_HEX < 0x030D0000
    return n > 5 ? _PyDict_NewPresized(n) : PyDict_New();
#else
    (void)n;
    return PyDict_New();
#endif
}

static PyObject *
utf8_error(Cursor *c, const unsigned char *at)
{
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        return NULL;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_ssize_t bad = 0;
    if (value == NULL || PyUnicodeDecodeError_GetStart(value, &bad) < 0) {
        PyErr_Clear();
        bad = 0;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Format(c->rd->corrupt, "invalid UTF-8 in a string at byte %zd", OFFSET(c, at) + bad);
    return NULL;
}

/* A str from n UTF-8 bytes at c->p (already bounds-checked), through the cache. */
static PyObject *
make_str(Cursor *c, Py_ssize_t n)
{
    const unsigned char *p = c->p;
    PyObject *s;
    c->p += n;
    if (n == 0 || n > STR_CACHE_MAX_LEN) {
        s = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
        return s != NULL ? s : utf8_error(c, p);
    }
    CacheEntry *e = &c->rd->cache[hash_bytes(p, n) & (STR_CACHE_SLOTS - 1)];
    if (e->str != NULL && e->len == n && memcmp(e->bytes, p, (size_t)n) == 0) {
        return Py_NewRef(e->str);
    }
    s = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    if (s == NULL) {
        return utf8_error(c, p);
    }
    PyObject *old = e->str;
    e->str = Py_NewRef(s);
    e->len = n;
    memcpy(e->bytes, p, (size_t)n);
    Py_XDECREF(old);
    return s;
}

static PyObject *
read_str(Cursor *c)
{
    Py_ssize_t n;
    if (read_length(c, &n, "a string") < 0) {
        return NULL;
    }
    return make_str(c, n);
}

static PyObject *
copy_default(PyObject *v)
{
    /* Defaults are JSON-shaped: only lists and dicts need a fresh copy per record. */
    if (PyList_CheckExact(v)) {
        Py_ssize_t n = PyList_GET_SIZE(v);
        PyObject *out = PyList_New(n);
        if (out == NULL) {
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *x = copy_default(PyList_GET_ITEM(v, i));
            if (x == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            PyList_SET_ITEM(out, i, x);
        }
        return out;
    }
    if (PyDict_CheckExact(v)) {
        PyObject *out = PyDict_New(), *key, *x;
        Py_ssize_t pos = 0;
        if (out == NULL) {
            return NULL;
        }
        while (PyDict_Next(v, &pos, &key, &x)) {
            PyObject *copy = copy_default(x);
            if (copy == NULL || PyDict_SetItem(out, key, copy) < 0) {
                Py_XDECREF(copy);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(copy);
        }
        return out;
    }
    return Py_NewRef(v);
}

static PyObject *decode_node(Cursor *c, const Node *nd);

/* Items of an array, collected before the list is made so that no list with empty slots
 * is ever visible (building an item can run the garbage collector). */
typedef struct {
    PyObject **items;
    Py_ssize_t len;
    Py_ssize_t cap;
    PyObject *stack[STACK_ITEMS];
} Items;

static int
items_reserve(Items *it, Py_ssize_t extra)
{
    if (it->cap - it->len >= extra) {
        return 0;
    }
    Py_ssize_t want = it->len + extra;
    Py_ssize_t cap = it->cap * 2 > want ? it->cap * 2 : want;
    if ((size_t)cap > PY_SSIZE_T_MAX / sizeof(PyObject *)) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items;
    if (it->items == it->stack) {
        items = PyMem_Malloc((size_t)cap * sizeof(PyObject *));
        if (items != NULL) {
            memcpy(items, it->stack, (size_t)it->len * sizeof(PyObject *));
        }
    }
    else {
        items = PyMem_Realloc(it->items, (size_t)cap * sizeof(PyObject *));
    }
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    it->items = items;
    it->cap = cap;
    return 0;
}

static void
items_clear(Items *it)
{
    for (Py_ssize_t i = 0; i < it->len; i++) {
        Py_DECREF(it->items[i]);
    }
    if (it->items != it->stack) {
        PyMem_Free(it->items);
    }
}

static PyObject *
decode_array(Cursor *c, const Node *nd)
{
    const Node *item = nd->item;
    Items it;
    it.items = it.stack;
    it.len = 0;
    it.cap = STACK_ITEMS;
    for (;;) {
        uint64_t count;
        if (read_count(c, &count) < 0) {
            goto fail;
        }
        if (count == 0) {
            break;
        }
        /* Reserve what the remaining bytes can hold at most; a corrupt count then fails
         * where the Python reader fails, when an item runs out of data. */
        Py_ssize_t remaining = c->end - c->p;
        uint64_t hint = count;
        if (item->min_size == 0) {
            if (count > (uint64_t)(MAX_ZERO_WIDTH_ITEMS - it.len)) {
                PyErr_Format(c->rd->corrupt, "array of more than %d zero-width items at offset %zd",
                             MAX_ZERO_WIDTH_ITEMS, OFFSET(c, c->p));
                goto fail;
            }
        }
        else if (hint > (uint64_t)(remaining / item->min_size)) {
            hint = (uint64_t)(remaining / item->min_size);
        }
        if (item->op == OP_DOUBLE) {
            /* The Python reader unpacks a block of doubles in one call: all there, or truncated. */
            if (count > (uint64_t)(remaining / 8)) {
                truncated(c, "an array of doubles");
                goto fail;
            }
            if (items_reserve(&it, (Py_ssize_t)count) < 0) {
                goto fail;
            }
            for (uint64_t k = 0; k < count; k++) {
                double d = load_double(c->p);
                c->p += 8;
                PyObject *x = PyFloat_FromDouble(d);
                if (x == NULL) {
                    goto fail;
                }
                it.items[it.len++] = x;
            }
            continue;
        }
        if (items_reserve(&it, (Py_ssize_t)hint) < 0) {
            goto fail;
        }
        for (uint64_t k = 0; k < count; k++) {
            if (it.len == it.cap && items_reserve(&it, 1) < 0) {
                goto fail;
            }
            PyObject *x = decode_node(c, item);
            if (x == NULL) {
                goto fail;
            }
            it.items[it.len++] = x;
        }
    }
    PyObject *list = PyList_New(it.len);
    if (list == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < it.len; i++) {
        PyList_SET_ITEM(list, i, it.items[i]);
    }
    if (it.items != it.stack) {
        PyMem_Free(it.items);
    }
    return list;
fail:
    items_clear(&it);
    return NULL;
}

static PyObject *
decode_map(Cursor *c, const Node *nd)
{
    const Node *value = nd->item;
    PyObject *dict = NULL;
    for (;;) {
        uint64_t count;
        if (read_count(c, &count) < 0) {
            goto fail;
        }
        if (count == 0) {
            break;
        }
        if (dict == NULL) {
            /* Presized to what the remaining bytes can hold (each entry has its key's length). */
            uint64_t hint = (uint64_t)((c->end - c->p) / sat_add(1, value->min_size));
            hint = hint < count ? hint : count;
            dict = new_dict(hint < 4096 ? (Py_ssize_t)hint : 4096);
            if (dict == NULL) {
                goto fail;
            }
        }
        for (uint64_t k = 0; k < count; k++) {
            PyObject *key = read_str(c);
            if (key == NULL) {
                goto fail;
            }
            PyObject *x;
            if (value->op == OP_DOUBLE) {
                if (c->end - c->p < 8) {
                    Py_DECREF(key);
                    truncated(c, "a double");
                    goto fail;
                }
                double d = load_double(c->p);
                c->p += 8;
                x = PyFloat_FromDouble(d);
            }
            else {
                x = decode_node(c, value);
            }
            if (x == NULL) {
                Py_DECREF(key);
                goto fail;
            }
            int rc = PyDict_SetItem(dict, key, x);
            Py_DECREF(key);
            Py_DECREF(x);
            if (rc < 0) {
                goto fail;
            }
        }
    }
    return dict != NULL ? dict : PyDict_New();
fail:
    Py_XDECREF(dict);
    return NULL;
}

static PyObject *
decode_record(Cursor *c, const Node *nd)
{
    PyObject *dict = new_dict(nd->nfields);
    if (dict == NULL) {
        return NULL;
    }
    if (nd->in_order) {
        for (Py_ssize_t i = 0; i < nd->nsteps; i++) {
            PyObject *x = decode_node(c, nd->steps[i].node);
            if (x == NULL) {
                goto fail;
            }
            int rc = PyDict_SetItem(dict, nd->fields[i].key, x);
            Py_DECREF(x);
            if (rc < 0) {
                goto fail;
            }
        }
        for (Py_ssize_t i = nd->nsteps; i < nd->nfields; i++) {
            PyObject *x = copy_default(nd->fields[i].dflt);
            if (x == NULL) {
                goto fail;
            }
            int rc = PyDict_SetItem(dict, nd->fields[i].key, x);
            Py_DECREF(x);
            if (rc < 0) {
                goto fail;
            }
        }
        return dict;
    }
    /* Out of order, skipped or defaulted fields: read in writer order, build in reader order. */
    PyObject *stack[STACK_SLOTS];
    PyObject **slots = stack;
    if (nd->nfields > STACK_SLOTS) {
        slots = PyMem_Calloc((size_t)nd->nfields, sizeof(PyObject *));
        if (slots == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    else {
        memset(stack, 0, sizeof(stack));
    }
    int ok = 0;
    for (Py_ssize_t i = 0; i < nd->nsteps; i++) {
        PyObject *x = decode_node(c, nd->steps[i].node);
        if (x == NULL) {
            goto done;
        }
        if (nd->steps[i].slot < 0) {
            Py_DECREF(x);
        }
        else {
            slots[nd->steps[i].slot] = x;
        }
    }
    for (Py_ssize_t i = 0; i < nd->nfields; i++) {
        PyObject *x = slots[i];
        slots[i] = NULL;
        if (x == NULL && (x = copy_default(nd->fields[i].dflt)) == NULL) {
            goto done;
        }
        int rc = PyDict_SetItem(dict, nd->fields[i].key, x);
        Py_DECREF(x);
        if (rc < 0) {
            goto done;
        }
    }
    ok = 1;
done:
    for (Py_ssize_t i = 0; i < nd->nfields; i++) {
        Py_XDECREF(slots[i]);
    }
    if (slots != stack) {
        PyMem_Free(slots);
    }
    if (ok) {
        return dict;
    }
fail:
    Py_DECREF(dict);
    return NULL;
}

static PyObject *
decode_node(Cursor *c, const Node *nd)
{
    switch (nd->op) {
    case OP_NULL:
        Py_RETURN_NONE;
    case OP_BOOLEAN: {
        if (c->p >= c->end) {
            truncated(c, "a boolean");
            return NULL;
        }
        unsigned int b = *c->p++;
        if (b > 1) {
            PyErr_Format(c->rd->corrupt, "boolean byte %u at offset %zd", b, OFFSET(c, c->p - 1));
            return NULL;
        }
        return PyBool_FromLong(b);
    }
    case OP_INT:
    case OP_LONG:
    case OP_LONG_AS_DOUBLE: {
        int64_t v;
        if (read_long(c, &v) < 0) {
            return NULL;
        }
        return nd->op == OP_LONG_AS_DOUBLE ? PyFloat_FromDouble((double)v) : PyLong_FromLongLong(v);
    }
    case OP_FLOAT: {
        if (c->end - c->p < 4) {
            truncated(c, "a float");
            return NULL;
        }
        double d = PyFloat_Unpack4((const char *)c->p, 1);
        c->p += 4;
        return PyFloat_FromDouble(d);
    }
    case OP_DOUBLE: {
        if (c->end - c->p < 8) {
            truncated(c, "a double");
            return NULL;
        }
        double d = load_double(c->p);
        c->p += 8;
        return PyFloat_FromDouble(d);
    }
    case OP_STRING:
        return read_str(c);
    case OP_BYTES:
    case OP_FIXED: {
        Py_ssize_t n = nd->size;
        if (nd->op == OP_BYTES) {
            if (read_length(c, &n, "bytes") < 0) {
                return NULL;
            }
        }
        else if (c->end - c->p < n) {
            truncated(c, "a fixed");
            return NULL;
        }
        PyObject *b = PyBytes_FromStringAndSize((const char *)c->p, n);
        c->p += n;
        return b;
    }
    case OP_ENUM: {
        int64_t i;
        if (read_long(c, &i) < 0) {
            return NULL;
        }
        if (i < 0 || i >= PyTuple_GET_SIZE(nd->symbols)) {
            PyErr_Format(c->rd->corrupt, "enum index %lld of %U", (long long)i, nd->name);
            return NULL;
        }
        PyObject *s = PyTuple_GET_ITEM(nd->symbols, (Py_ssize_t)i);
        if (s == Py_None) {
            PyErr_Format(c->rd->incompatible, "%U symbol %lld is unknown to the reader", nd->name, (long long)i);
            return NULL;
        }
        return Py_NewRef(s);
    }
    case OP_UNION: {
        int64_t i;
        if (read_long(c, &i) < 0) {
            return NULL;
        }
        if (i < 0 || i >= nd->nbranches) {
            PyErr_Format(c->rd->corrupt, "union index %lld out of range", (long long)i);
            return NULL;
        }
        if (nd->branches[i] == NULL) {
            PyErr_Format(c->rd->incompatible, "union branch %lld of the writer has no match in the reader schema",
                         (long long)i);
            return NULL;
        }
        return decode_node(c, nd->branches[i]);
    }
    case OP_ARRAY:
        return decode_array(c, nd);
    case OP_MAP:
        return decode_map(c, nd);
    case OP_RECORD:
        return decode_record(c, nd);
    default:
        PyErr_Format(PyExc_SystemError, "reader node with op %d", nd->op);
        return NULL;
    }
}

static void
reader_dealloc(ReaderObject *self)
{
    node_free(self->root);
    if (self->cache != NULL) {
        for (Py_ssize_t i = 0; i < STR_CACHE_SLOTS; i++) {
            Py_XDECREF(self->cache[i].str);
        }
        PyMem_Free(self->cache);
    }
    Py_XDECREF(self->truncated);
    Py_XDECREF(self->corrupt);
    Py_XDECREF(self->incompatible);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"program", "truncated", "corrupt", "incompatible", NULL};
    PyObject *program, *trunc, *corrupt, *incompatible;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO:Reader", kwlist, &program, &trunc, &corrupt,
                                     &incompatible)) {
        return NULL;
    }
    if (!PyExceptionClass_Check(trunc) || !PyExceptionClass_Check(corrupt) ||
        !PyExceptionClass_Check(incompatible)) {
        PyErr_SetString(PyExc_TypeError, "truncated, corrupt and incompatible must be exception classes");
        return NULL;
    }
    ReaderObject *self = (ReaderObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->truncated = Py_NewRef(trunc);
    self->corrupt = Py_NewRef(corrupt);
    self->incompatible = Py_NewRef(incompatible);
    self->cache = PyMem_Calloc(STR_CACHE_SLOTS, sizeof(CacheEntry));
    if (self->cache == NULL) {
        PyErr_NoMemory();
        Py_DECREF(self);
        return NULL;
    }
    self->root = build_node(program, 0, 0);
    if (self->root == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* One value from data[pos:]; returns it and sets *end, or NULL with an exception. */
static PyObject *
reader_run(ReaderObject *self, const unsigned char *data, Py_ssize_t len, Py_ssize_t pos, Py_ssize_t *end)
{
    Cursor c;
    c.start = data;
    c.p = data + pos;
    c.end = data + len;
    c.rd = self;
    PyObject *out = decode_node(&c, self->root);
    *end = OFFSET(&c, c.p);
    return out;
}

PyDoc_STRVAR(reader_decode_doc,
"decode(buf, pos=0) -> (value, next_pos)\n\n"
"Read one value of the writer schema from buf at pos, as the reader schema.");

static PyObject *
reader_decode(ReaderObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "decode() takes 1 or 2 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_buffer view;
    const unsigned char *data;
    Py_ssize_t len, pos = 0, end = 0;
    int release = 0;
    if (PyBytes_CheckExact(args[0])) {
        data = (const unsigned char *)PyBytes_AS_STRING(args[0]);
        len = PyBytes_GET_SIZE(args[0]);
    }
    else {
        if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
            return NULL;
        }
        release = 1;
        data = view.buf;
        len = view.len;
    }
    PyObject *value = NULL, *result = NULL;
    if (nargs == 2) {
        pos = PyLong_AsSsize_t(args[1]);
        if (pos == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (pos < 0) {
            PyErr_SetString(PyExc_ValueError, "pos must be >= 0");
            goto done;
        }
        if (pos > len) {
            PyErr_Format(self->truncated, "pos %zd is past the end of the data (%zd bytes)", pos, len);
            goto done;
        }
    }
    value = reader_run(self, data, len, pos, &end);
    if (value != NULL) {
        PyObject *next = PyLong_FromSsize_t(end);
        if (next != NULL) {
            result = PyTuple_Pack(2, value, next);
            Py_DECREF(next);
        }
        Py_DECREF(value);
    }
done:
    if (release) {
        PyBuffer_Release(&view);
    }
    return result;
}

PyDoc_STRVAR(reader_decode_batch_doc,
"decode_batch(payloads, header, max_size, redo) -> (values, redo_count)\n\n"
"Decode every payload of the list that is bytes, at most max_size long and starts with\n"
"header, from just after the header. Any other payload, and any that fails to decode with\n"
"one of the reader's errors, is left as `redo` in the result for the caller to handle.");

static PyObject *
reader_decode_batch(ReaderObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "decode_batch() takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *payloads = args[0], *header = args[1], *redo = args[3];
    if (!PyList_Check(payloads) || !PyBytes_Check(header)) {
        PyErr_SetString(PyExc_TypeError, "decode_batch() takes a list of payloads and a bytes header");
        return NULL;
    }
    Py_ssize_t max_size = PyLong_AsSsize_t(args[2]);
    if (max_size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    /* The header is copied: a payload's decoding cannot change it, but be independent of it. */
    unsigned char hdr[16];
    Py_ssize_t hlen = PyBytes_GET_SIZE(header);
    if (hlen > (Py_ssize_t)sizeof(hdr)) {
        PyErr_SetString(PyExc_ValueError, "header longer than 16 bytes");
        return NULL;
    }
    memcpy(hdr, PyBytes_AS_STRING(header), (size_t)hlen);
    Py_ssize_t n = PyList_GET_SIZE(payloads), redone = n;
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyList_SET_ITEM(out, i, Py_NewRef(redo));
    }
    /* The cyclic collector is paused for the batch and runs once after it. Every ~22 events
     * allocate enough containers to trigger a young collection, and every tenth of those
     * rescans all the batch's events so far, which are alive by construction: pausing
     * measured ~1.3x faster at 1,000 events. No Python code runs in the loop (nothing here
     * calls any, and the collector's finalizers are what the pause holds back), so no other
     * thread can see the pause. */
    int gc_enabled = PyGC_Disable();
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(payloads); i++) {
        PyObject *payload = PyList_GET_ITEM(payloads, i);
        if (!PyBytes_CheckExact(payload)) {
            continue;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(payload), end;
        const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(payload);
        if (len > max_size || len < hlen || memcmp(data, hdr, (size_t)hlen) != 0) {
            continue;
        }
        Py_INCREF(payload);
        PyObject *value = reader_run(self, data, len, hlen, &end);
        Py_DECREF(payload);
        if (value == NULL) {
            if (PyErr_ExceptionMatches(self->truncated) || PyErr_ExceptionMatches(self->corrupt) ||
                PyErr_ExceptionMatches(self->incompatible)) {
                PyErr_Clear();
                continue;
            }
            Py_CLEAR(out);
            break;
        }
        PyObject *old = PyList_GET_ITEM(out, i);
        PyList_SET_ITEM(out, i, value);
        Py_DECREF(old);
        redone--;
    }
    if (gc_enabled) {
        PyGC_Enable();
    }
    return out == NULL ? NULL : Py_BuildValue("(Nn)", out, redone);
}

static PyMethodDef reader_methods[] = {
    {"decode", (PyCFunction)(void (*)(void))reader_decode, METH_FASTCALL, reader_decode_doc},
    {"decode_batch", (PyCFunction)(void (*)(void))reader_decode_batch, METH_FASTCALL, reader_decode_batch_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(reader_doc,
"Reader(program, truncated, corrupt, incompatible)\n\n"
"A compiled Avro reader for one (writer schema, reader schema) pair. `program` is the tree\n"
"streams._avrocodec builds; the three exception classes are raised for data that ends\n"
"early, data that is not Avro of the writer schema, and values the reader cannot hold.");

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streams._avrofast.Reader",
    .tp_basicsize = sizeof(ReaderObject),
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = reader_doc,
    .tp_methods = reader_methods,
    .tp_new = reader_new,
};

/* ---------------------------------------------------------------------------------------
 * Writer */

typedef struct {
    unsigned char *p;
    Py_ssize_t len;
    Py_ssize_t cap;
    unsigned char stack[2048];
} Buf;

static int
buf_grow(Buf *b, Py_ssize_t extra)
{
    if (extra > PY_SSIZE_T_MAX / 2 - b->len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t cap = b->cap * 2 > b->len + extra ? b->cap * 2 : b->len + extra;
    unsigned char *p;
    if (b->p == b->stack) {
        p = PyMem_Malloc((size_t)cap);
        if (p != NULL) {
            memcpy(p, b->stack, (size_t)b->len);
        }
    }
    else {
        p = PyMem_Realloc(b->p, (size_t)cap);
    }
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int
buf_reserve(Buf *b, Py_ssize_t extra)
{
    return b->cap - b->len >= extra ? 0 : buf_grow(b, extra);
}

static inline int
put_long(Buf *b, int64_t v)
{
    if (buf_reserve(b, 10) < 0) {
        return -1;
    }
    uint64_t n = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    unsigned char *q = b->p + b->len;
    while (n > 0x7F) {
        *q++ = (unsigned char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    *q++ = (unsigned char)n;
    b->len = q - b->p;
    return 0;
}

static inline int
put_raw(Buf *b, const void *data, Py_ssize_t n)
{
    if (put_long(b, n) < 0 || buf_reserve(b, n) < 0) {
        return -1;
    }
    memcpy(b->p + b->len, data, (size_t)n);
    b->len += n;
    return 0;
}

static inline int
put_double(Buf *b, PyObject *v)
{
    double d = PyFloat_CheckExact(v) ? PyFloat_AS_DOUBLE(v) : PyFloat_AsDouble(v);
    if (d == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    if (buf_reserve(b, 8) < 0) {
        return -1;
    }
#if PY_LITTLE_ENDIAN
    memcpy(b->p + b->len, &d, 8);
#else
    if (PyFloat_Pack8(d, (char *)b->p + b->len, 1) < 0) {
        return -1;
    }
#endif
    b->len += 8;
    return 0;
}

static int encode_node(Buf *b, const Node *nd, PyObject *v);

static int
encode_str(Buf *b, PyObject *v)
{
    if (!PyUnicode_Check(v)) {
        PyErr_Format(PyExc_TypeError, "str expected, not %.80s", Py_TYPE(v)->tp_name);
        return -1;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(v, &n);
    return s == NULL ? -1 : put_raw(b, s, n);
}

static int
encode_array(Buf *b, const Node *nd, PyObject *v)
{
    if (!PyList_Check(v) && !PyTuple_Check(v)) {
        PyErr_Format(PyExc_TypeError, "list or tuple expected, not %.80s", Py_TYPE(v)->tp_name);
        return -1;
    }
    Py_ssize_t n = Py_SIZE(v);
    if (n > 0) {
        if (put_long(b, n) < 0) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            /* Converting an item may run Python code (__float__, __index__) that changes a list. */
            if (Py_SIZE(v) != n) {
                PyErr_SetString(PyExc_ValueError, "array changed size while it was encoded");
                return -1;
            }
            PyObject *x = PyList_Check(v) ? PyList_GET_ITEM(v, i) : PyTuple_GET_ITEM(v, i);
            Py_INCREF(x);
            int rc = nd->item->op == OP_DOUBLE ? put_double(b, x) : encode_node(b, nd->item, x);
            Py_DECREF(x);
            if (rc < 0) {
                return -1;
            }
        }
        if (Py_SIZE(v) != n) {
            PyErr_SetString(PyExc_ValueError, "array changed size while it was encoded");
            return -1;
        }
    }
    if (buf_reserve(b, 1) < 0) {
        return -1;
    }
    b->p[b->len++] = 0;
    return 0;
}

static int
encode_map(Buf *b, const Node *nd, PyObject *v)
{
    if (!PyDict_CheckExact(v)) {
        PyErr_Format(PyExc_TypeError, "dict expected, not %.80s", Py_TYPE(v)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyDict_GET_SIZE(v);
    if (n > 0) {
        if (put_long(b, n) < 0) {
            return -1;
        }
        Py_ssize_t pos = 0, seen = 0;
        PyObject *key, *x;
        while (PyDict_Next(v, &pos, &key, &x)) {
            if (++seen > n) {
                break;
            }
            Py_INCREF(key);
            Py_INCREF(x);
            int rc = encode_str(b, key);
            if (rc == 0) {
                rc = nd->item->op == OP_DOUBLE ? put_double(b, x) : encode_node(b, nd->item, x);
            }
            Py_DECREF(key);
            Py_DECREF(x);
            if (rc < 0) {
                return -1;
            }
        }
        if (seen != n || PyDict_GET_SIZE(v) != n) {
            PyErr_SetString(PyExc_ValueError, "map changed size while it was encoded");
            return -1;
        }
    }
    if (buf_reserve(b, 1) < 0) {
        return -1;
    }
    b->p[b->len++] = 0;
    return 0;
}

static int
encode_record(Buf *b, const Node *nd, PyObject *v)
{
    if (!PyDict_CheckExact(v)) {
        PyErr_Format(PyExc_TypeError, "dict expected for a record, not %.80s", Py_TYPE(v)->tp_name);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nd->nfields; i++) {
        const Field *f = &nd->fields[i];
        PyObject *x = PyDict_GetItemWithError(v, f->key);
        if (x == NULL) {
            if (PyErr_Occurred()) {
                return -1;
            }
            if (f->dflt == NULL) {
                PyErr_SetObject(PyExc_KeyError, f->key);
                return -1;
            }
            Py_ssize_t n = PyBytes_GET_SIZE(f->dflt);
            if (buf_reserve(b, n) < 0) {
                return -1;
            }
            memcpy(b->p + b->len, PyBytes_AS_STRING(f->dflt), (size_t)n);
            b->len += n;
            continue;
        }
        Py_INCREF(x);
        int rc = encode_node(b, f->node, x);
        Py_DECREF(x);
        if (rc < 0) {
            return -1;
        }
    }
    return 0;
}

static int
encode_node(Buf *b, const Node *nd, PyObject *v)
{
    switch (nd->op) {
    case OP_NULL:
        if (v != Py_None) {
            PyErr_SetString(PyExc_TypeError, "null field holds a value");
            return -1;
        }
        return 0;
    case OP_BOOLEAN:
        if (v != Py_True && v != Py_False) {
            PyErr_SetString(PyExc_TypeError, "boolean expected");
            return -1;
        }
        if (buf_reserve(b, 1) < 0) {
            return -1;
        }
        b->p[b->len++] = v == Py_True;
        return 0;
    case OP_INT:
    case OP_LONG: {
        long long n;
        if (PyLong_Check(v)) {
            n = PyLong_AsLongLong(v);
        }
        else {
            PyObject *i = PyNumber_Index(v);
            if (i == NULL) {
                return -1;
            }
            n = PyLong_AsLongLong(i);
            Py_DECREF(i);
        }
        if (n == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (nd->op == OP_INT && (n < INT32_MIN || n > INT32_MAX)) {
            PyErr_Format(PyExc_OverflowError, "%lld does not fit an Avro int", n);
            return -1;
        }
        return put_long(b, n);
    }
    case OP_FLOAT: {
        double d = PyFloat_AsDouble(v);
        if ((d == -1.0 && PyErr_Occurred()) || buf_reserve(b, 4) < 0) {
            return -1;
        }
        if (PyFloat_Pack4(d, (char *)b->p + b->len, 1) < 0) {
            return -1;
        }
        b->len += 4;
        return 0;
    }
    case OP_DOUBLE:
        return put_double(b, v);
    case OP_STRING:
        return encode_str(b, v);
    case OP_BYTES:
        if (PyBytes_Check(v)) {
            return put_raw(b, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
        }
        if (PyByteArray_Check(v)) {
            return put_raw(b, PyByteArray_AS_STRING(v), PyByteArray_GET_SIZE(v));
        }
        PyErr_SetString(PyExc_TypeError, "bytes expected");
        return -1;
    case OP_FIXED: {
        const char *p;
        Py_ssize_t n;
        if (PyBytes_Check(v)) {
            p = PyBytes_AS_STRING(v);
            n = PyBytes_GET_SIZE(v);
        }
        else if (PyByteArray_Check(v)) {
            p = PyByteArray_AS_STRING(v);
            n = PyByteArray_GET_SIZE(v);
        }
        else {
            n = -1;
            p = NULL;
        }
        if (n != nd->size) {
            PyErr_SetString(PyExc_TypeError, "fixed of the wrong size");
            return -1;
        }
        if (buf_reserve(b, n) < 0) {
            return -1;
        }
        memcpy(b->p + b->len, p, (size_t)n);
        b->len += n;
        return 0;
    }
    case OP_ENUM: {
        PyObject *index = PyDict_GetItemWithError(nd->symbols, v);
        if (index == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetObject(PyExc_KeyError, v);
            }
            return -1;
        }
        Py_ssize_t n = PyBytes_GET_SIZE(index);
        if (buf_reserve(b, n) < 0) {
            return -1;
        }
        memcpy(b->p + b->len, PyBytes_AS_STRING(index), (size_t)n);
        b->len += n;
        return 0;
    }
    case OP_OPTIONAL:
        if (v == Py_None) {
            return put_long(b, nd->size);
        }
        if (put_long(b, 1 - nd->size) < 0) {
            return -1;
        }
        return encode_node(b, nd->item, v);
    case OP_ARRAY:
        return encode_array(b, nd, v);
    case OP_MAP:
        return encode_map(b, nd, v);
    case OP_RECORD:
        return encode_record(b, nd, v);
    default:
        PyErr_Format(PyExc_SystemError, "writer node with op %d", nd->op);
        return -1;
    }
}

typedef struct {
    PyObject_HEAD
    Node *root;
} WriterObject;

static void
writer_dealloc(WriterObject *self)
{
    node_free(self->root);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
writer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"program", NULL};
    PyObject *program;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:Writer", kwlist, &program)) {
        return NULL;
    }
    WriterObject *self = (WriterObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->root = build_node(program, 1, 0);
    if (self->root == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

PyDoc_STRVAR(writer_encode_doc,
"encode(value) -> bytes\n\n"
"The Avro binary encoding of value. Raises TypeError, KeyError, ValueError or\n"
"OverflowError for a value it does not take as-is.");

static PyObject *
writer_encode(WriterObject *self, PyObject *value)
{
    Buf b;
    b.p = b.stack;
    b.len = 0;
    b.cap = sizeof(b.stack);
    PyObject *out = NULL;
    if (encode_node(&b, self->root, value) == 0) {
        out = PyBytes_FromStringAndSize((const char *)b.p, b.len);
    }
    if (b.p != b.stack) {
        PyMem_Free(b.p);
    }
    return out;
}

static PyMethodDef writer_methods[] = {
    {"encode", (PyCFunction)writer_encode, METH_O, writer_encode_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(writer_doc,
"Writer(program)\n\n"
"A compiled Avro writer for one schema; `program` is the tree streams._avrocodec builds.");

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streams._avrofast.Writer",
    .tp_basicsize = sizeof(WriterObject),
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = writer_doc,
    .tp_methods = writer_methods,
    .tp_new = writer_new,
};

/* ---------------------------------------------------------------------------------------
 * Module */

/* Kafka's murmur2 (the Java client's Utils.murmur2, librdkafka's rd_murmur2): the hash its
 * default partitioner and librdkafka's "murmur2_random" place a keyed record with. */
static uint32_t
murmur2(const unsigned char *data, Py_ssize_t length)
{
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    Py_ssize_t i = 0;
    for (; i + 4 <= length; i += 4) {
        uint32_t k = (uint32_t)data[i] | ((uint32_t)data[i + 1] << 8) | ((uint32_t)data[i + 2] << 16) |
                     ((uint32_t)data[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)data[i + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[i + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)data[i];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

PyDoc_STRVAR(murmur2_doc,
"murmur2(key: bytes) -> int\n\n"
"Kafka's murmur2 hash of a record key, as an unsigned 32-bit int; the default partitioner's\n"
"partition is (murmur2(key) & 0x7fffffff) % partitions.");

static PyObject *
module_murmur2(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint32_t h = murmur2((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(h);
}

static PyMethodDef module_methods[] = {
    {"murmur2", (PyCFunction)module_murmur2, METH_O, murmur2_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(module_doc,
"Compiled Avro reader and writer programs; built and used by streams._avrocodec. And Kafka's\n"
"murmur2 key hash (streams.partitioning).");

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "streams._avrofast",
    .m_doc = module_doc,
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__avrofast(void)
{
    if (PyType_Ready(&ReaderType) < 0 || PyType_Ready(&WriterType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Reader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddObjectRef(m, "Writer", (PyObject *)&WriterType) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
