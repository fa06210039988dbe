/* The compiled insert of FrameStorage: one vector step (every env once, in env order, no episode end) in one call.
 *
 * Plain CPython C API and the buffer protocol, no numpy headers: the build needs setuptools and a C compiler only.
 * See docs/design/pixel-replay.md ("Compiled insert") for what is covered and why the call is atomic.
 *
 * A Plan holds the storage's arrays (pool, frame references, per-env state, pending frames, the other fields) as
 * buffers acquired once; Plan.step(...) checks a batch against them and either changes nothing and returns None
 * (the caller takes the Python path) or writes the whole step, sets the counters and clears the caller's
 * interrupt record, and returns the first slot written. Every check comes before the first write, and no Python
 * code runs inside the call, so a KeyboardInterrupt lands before the step or after all of it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAXDIM 16

typedef struct {
    PyObject_HEAD
    Py_buffer pool, obs_refs, next_refs, state, pending;
    int held; /* how many of the five buffers above are held (acquired in that order) */
    Py_ssize_t nfields, fields_held;
    PyObject *names; /* tuple of the other fields' names (str) */
    Py_buffer *fields;
    Py_ssize_t row_bytes[64];
    Py_ssize_t env_k, terminated_k, truncated_k; /* indices of those fields in names */
    Py_ssize_t S, n, W, E, capacity, pool_size, frame_bytes, frame_ndim, itemsize;
    Py_ssize_t frame_shape[MAXDIM];
} Plan;

static PyObject *s_cursor, *s_size, *s_total_added, *s_frames_written, *s_numbered, *s_seen_seq, *s_obs, *s_next_obs;

static void release_plan(Plan *p) {
    Py_buffer *own[5] = {&p->pool, &p->obs_refs, &p->next_refs, &p->state, &p->pending};
    for (int i = 0; i < p->held; i++) PyBuffer_Release(own[i]);
    p->held = 0;
    for (Py_ssize_t k = 0; k < p->fields_held; k++) PyBuffer_Release(&p->fields[k]);
    p->fields_held = 0;
    PyMem_Free(p->fields);
    p->fields = NULL;
    Py_CLEAR(p->names);
}

static void Plan_dealloc(Plan *p) {
    release_plan(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int is_int64(const Py_buffer *b) {
    return b->itemsize == 8 && b->format != NULL && (strcmp(b->format, "l") == 0 || strcmp(b->format, "q") == 0 ||
                                                     strcmp(b->format, "<l") == 0 || strcmp(b->format, "<q") == 0);
}

static int same_format(const Py_buffer *a, const Py_buffer *b) {
    return a->itemsize == b->itemsize && a->format != NULL && b->format != NULL && strcmp(a->format, b->format) == 0;
}

static int plan_error(const char *what) {
    PyErr_Format(PyExc_ValueError, "_frame_insert.Plan: %s", what);
    return -1;
}

/* Plan(pool, obs_refs, next_refs, state, pending, names, fields) */
static int Plan_init(Plan *p, PyObject *args, PyObject *kwds) {
    PyObject *pool, *obs_refs, *next_refs, *state, *pending, *names, *fields;
    if (kwds != NULL && PyDict_Size(kwds) > 0) return plan_error("takes positional arguments only");
    if (!PyArg_ParseTuple(args, "OOOOOO!O!", &pool, &obs_refs, &next_refs, &state, &pending, &PyTuple_Type, &names,
                          &PyTuple_Type, &fields))
        return -1;
    release_plan(p);
    PyObject *arrays[5] = {pool, obs_refs, next_refs, state, pending};
    Py_buffer *own[5] = {&p->pool, &p->obs_refs, &p->next_refs, &p->state, &p->pending};
    for (int i = 0; i < 5; i++) {
        if (PyObject_GetBuffer(arrays[i], own[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) return -1;
        p->held = i + 1;
    }
    if (p->pool.ndim < 1 || p->pool.ndim > MAXDIM) return plan_error("pool must be [pool_size, *frame]");
    p->pool_size = p->pool.shape[0];
    p->itemsize = p->pool.itemsize;
    p->frame_ndim = p->pool.ndim - 1;
    p->frame_bytes = p->itemsize;
    for (int d = 1; d < p->pool.ndim; d++) {
        p->frame_shape[d - 1] = p->pool.shape[d];
        p->frame_bytes *= p->pool.shape[d];
    }
    if (p->obs_refs.ndim != 2 || p->next_refs.ndim != 2 || !is_int64(&p->obs_refs) || !is_int64(&p->next_refs) ||
        p->obs_refs.shape[0] != p->next_refs.shape[0] || p->obs_refs.shape[1] != p->next_refs.shape[1])
        return plan_error("obs_refs and next_refs must be int64 [capacity, S]");
    p->capacity = p->obs_refs.shape[0];
    p->S = p->obs_refs.shape[1];
    if (p->state.ndim != 2 || !is_int64(&p->state) || p->state.shape[1] < 2 * p->S + 2)
        return plan_error("state must be int64 [E, 2S + 1 + n]");
    p->E = p->state.shape[0];
    p->W = p->state.shape[1];
    p->n = p->W - 2 * p->S - 1;
    if (p->pending.ndim != p->pool.ndim + 1 || !same_format(&p->pending, &p->pool) || p->pending.shape[0] != p->E ||
        p->pending.shape[1] != p->n)
        return plan_error("pending must be [E, n, *frame] of the pool's dtype");
    for (int d = 1; d < p->pool.ndim; d++)
        if (p->pending.shape[d + 1] != p->pool.shape[d]) return plan_error("pending frames differ from the pool's");
    p->nfields = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(fields) != p->nfields || p->nfields > 64) return plan_error("names and fields differ");
    p->fields = PyMem_Calloc(p->nfields ? p->nfields : 1, sizeof(Py_buffer));
    if (p->fields == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    p->env_k = p->terminated_k = p->truncated_k = -1;
    for (Py_ssize_t k = 0; k < p->nfields; k++) {
        PyObject *name = PyTuple_GET_ITEM(names, k);
        if (!PyUnicode_Check(name)) return plan_error("field names must be str");
        Py_buffer *f = &p->fields[k];
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(fields, k), f, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) <
            0)
            return -1;
        p->fields_held = k + 1;
        if (f->ndim < 1 || f->shape[0] != p->capacity) return plan_error("every field must be [capacity, ...]");
        p->row_bytes[k] = f->len / p->capacity;
        if (PyUnicode_CompareWithASCIIString(name, "env_id") == 0) p->env_k = k;
        if (PyUnicode_CompareWithASCIIString(name, "terminated") == 0) p->terminated_k = k;
        if (PyUnicode_CompareWithASCIIString(name, "truncated") == 0) p->truncated_k = k;
    }
    if (p->env_k < 0 || p->terminated_k < 0 || p->truncated_k < 0)
        return plan_error("the fields must include env_id, terminated and truncated");
    if (!is_int64(&p->fields[p->env_k]) || p->fields[p->env_k].ndim != 1 || p->fields[p->terminated_k].itemsize != 1 ||
        p->fields[p->terminated_k].ndim != 1 || p->fields[p->truncated_k].itemsize != 1 ||
        p->fields[p->truncated_k].ndim != 1)
        return plan_error("env_id must be int64 [capacity], terminated and truncated bool [capacity]");
    Py_INCREF(names);
    p->names = names;
    return 0;
}

/* obs-shaped batch [count, S, *frame] of the pool's dtype whose frames are C-contiguous (any row/stack strides) */
static int obs_layout_ok(const Plan *p, const Py_buffer *b) {
    if (b->ndim != p->frame_ndim + 2 || b->shape[1] != p->S || !same_format(b, &p->pool) || b->strides == NULL)
        return 0;
    Py_ssize_t expect = p->itemsize;
    for (Py_ssize_t d = p->frame_ndim - 1; d >= 0; d--) {
        if (b->shape[d + 2] != p->frame_shape[d]) return 0;
        if (b->shape[d + 2] > 1 && b->strides[d + 2] != expect) return 0;
        expect *= b->shape[d + 2];
    }
    return 1;
}

static inline const char *frame_at(const Py_buffer *b, Py_ssize_t row, Py_ssize_t k) {
    return (const char *)b->buf + row * b->strides[0] + k * b->strides[1];
}

static inline Py_ssize_t pmod(int64_t a, Py_ssize_t m) { return (Py_ssize_t)(a % m); }

/* step(owner, record, storage, fields_storage, batch_fields, numbered, seq, trusted,
 *      cursor, size, total_added, frames_written, slot_numbers)
 * -> the slots written (slot_numbers[cursor:cursor + B]; the first slot, an int, when the ring wraps),
 *    or None (not covered: nothing changed) */
static PyObject *Plan_step(Plan *p, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "step takes 13 arguments");
        return NULL;
    }
    if (p->held != 5) {
        PyErr_SetString(PyExc_RuntimeError, "_frame_insert.Plan is not initialised");
        return NULL;
    }
    PyObject *owner = args[0], *record = args[1], *storage = args[2], *fstore = args[3], *d = args[4];
    PyObject *numbered = args[5], *seq = args[6];
    int trusted = PyObject_IsTrue(args[7]);
    long long cursor = PyLong_AsLongLong(args[8]), size = PyLong_AsLongLong(args[9]);
    long long total = PyLong_AsLongLong(args[10]), fw = PyLong_AsLongLong(args[11]);
    if (trusted < 0 || PyErr_Occurred()) return NULL;
    if (!PyDict_CheckExact(d) || PyDict_GET_SIZE(d) != p->nfields + 2) Py_RETURN_NONE;

    Py_buffer obs = {0}, nxt = {0};
    Py_buffer fb[64];
    Py_ssize_t got = 0; /* field buffers held */
    int have_obs = 0, have_nxt = 0;
    PyObject *result = Py_None; /* fallback unless every check passes */
    PyObject *o = PyDict_GetItemWithError(d, s_obs), *no = PyDict_GetItemWithError(d, s_next_obs);
    if (o == NULL || no == NULL) goto fallback;
    if (PyObject_GetBuffer(o, &obs, PyBUF_RECORDS_RO) < 0) goto fallback;
    have_obs = 1;
    if (PyObject_GetBuffer(no, &nxt, PyBUF_RECORDS_RO) < 0) goto fallback;
    have_nxt = 1;
    if (!obs_layout_ok(p, &obs) || !obs_layout_ok(p, &nxt)) goto fallback;
    const Py_ssize_t count = obs.shape[0], S = p->S, W = p->W, n = p->n, cap = p->capacity, P = p->pool_size;
    if (count < 1 || count > p->E || count > cap || count > P || nxt.shape[0] != count) goto fallback;
    for (Py_ssize_t k = 0; k < p->nfields; k++) {
        PyObject *v = PyDict_GetItemWithError(d, PyTuple_GET_ITEM(p->names, k));
        if (v == NULL) goto fallback;
        if (PyObject_GetBuffer(v, &fb[k], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fallback;
        got = k + 1;
        const Py_buffer *f = &p->fields[k];
        if (fb[k].ndim != f->ndim || fb[k].shape[0] != count || !same_format(&fb[k], f)) goto fallback;
        for (int dim = 1; dim < f->ndim; dim++)
            if (fb[k].shape[dim] != f->shape[dim]) goto fallback;
    }
    /* every env once, in env order, no episode end */
    const int64_t *env = (const int64_t *)fb[p->env_k].buf;
    const char *term = (const char *)fb[p->terminated_k].buf, *trunc = (const char *)fb[p->truncated_k].buf;
    for (Py_ssize_t i = 0; i < count; i++)
        if (env[i] != i || term[i] || trunc[i]) goto fallback;

    int64_t *state = (int64_t *)p->state.buf;
    int64_t *obs_refs = (int64_t *)p->obs_refs.buf, *next_refs = (int64_t *)p->next_refs.buf;
    char *pool = (char *)p->pool.buf, *pending = (char *)p->pending.buf;
    const Py_ssize_t fbytes = p->frame_bytes;
    /* the trusted step (FrameStorage._add_obs): every env trusted and its last stack still pooled after count writes */
    const int64_t floor1 = fw + count - P > 0 ? fw + count - P : 0;
    const int64_t floor2 = fw + count * S - P > 0 ? fw + count * S - P : 0; /* FrameStorage._insert_stacks */
    int all_trusted = trusted;
    for (Py_ssize_t i = 0; i < count && all_trusted; i++) {
        const int64_t *row = state + i * W;
        if (row[2 * S] != 1) all_trusted = 0;
        for (Py_ssize_t j = 0; j < S && all_trusted; j++)
            if (row[j] < floor1) all_trusted = 0;
    }
    if (!all_trusted) { /* compared where not trusted: each stack must continue its env's last one */
        for (Py_ssize_t i = 0; i < count; i++) {
            const int64_t *row = state + i * W;
            for (Py_ssize_t j = 0; j < S; j++)
                if (row[j] < floor2) goto fallback;
            if (trusted && row[2 * S] == 1) continue;
            for (Py_ssize_t j = 0; j + 1 < S; j++)
                if (memcmp(pool + pmod(row[j + 1], P) * fbytes, frame_at(&obs, i, j), fbytes) != 0) goto fallback;
        }
    }
    const int64_t total2 = total + count;
    const int64_t wait_floor = total2 - cap > 0 ? total2 - cap : 0;
    if (!trusted) { /* checked: the newest frame of a resolved next_obs must be this obs's newest (n_step right) */
        for (Py_ssize_t i = 0; i < count; i++) {
            const int64_t *row = state + i * W;
            if (row[2 * S + 1] >= wait_floor &&
                memcmp(pending + (i * n) * fbytes, frame_at(&obs, i, S - 1), fbytes) != 0)
                goto fallback;
        }
    }
    /* the new counters, made before the first write so that nothing can fail after it */
    const long long end = cursor + count;
    PyObject *v_cursor = PyLong_FromLongLong(end % cap);
    PyObject *v_size = PyLong_FromLongLong(size + count < cap ? size + count : cap);
    PyObject *v_total = PyLong_FromLongLong(total2);
    PyObject *v_fw = PyLong_FromLongLong(fw + count);
    PyObject *v_start = NULL; /* the slots: a view of slot_numbers, or the first slot when the ring wraps */
    if (end <= cap) {
        PyObject *sl = PyLong_FromLongLong(end), *st = PyLong_FromLongLong(cursor);
        PyObject *range = (sl && st) ? PySlice_New(st, sl, NULL) : NULL;
        v_start = range ? PyObject_GetItem(args[12], range) : NULL;
        Py_XDECREF(sl), Py_XDECREF(st), Py_XDECREF(range);
    } else {
        v_start = PyLong_FromLongLong(cursor);
    }
    if (!v_cursor || !v_size || !v_total || !v_fw || !v_start) {
        Py_XDECREF(v_cursor), Py_XDECREF(v_size), Py_XDECREF(v_total), Py_XDECREF(v_fw), Py_XDECREF(v_start);
        result = NULL;
        goto done;
    }

    /* ---- writes: nothing below can fail ---- */
    for (Py_ssize_t i = 0; i < count; i++) next_refs[pmod(cursor + i, cap) * S] = -1;
    for (Py_ssize_t k = 0; k < p->nfields; k++) { /* ArrayStorage.add: one or two slice copies */
        const Py_ssize_t rb = p->row_bytes[k];
        const Py_ssize_t first = end <= cap ? count : cap - cursor;
        memcpy((char *)p->fields[k].buf + cursor * rb, fb[k].buf, first * rb);
        if (first < count) memcpy(p->fields[k].buf, (const char *)fb[k].buf + first * rb, (count - first) * rb);
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t *row = state + i * W;
        const int64_t slot = pmod(cursor + i, cap);
        memcpy(pool + pmod(fw + i, P) * fbytes, frame_at(&obs, i, S - 1), fbytes); /* the newest frame */
        memmove(row, row + 1, (S - 1) * sizeof(int64_t));
        row[S - 1] = fw + i;
        row[2 * S] = 1;
        memcpy(obs_refs + slot * S, row, S * sizeof(int64_t));
        int64_t *recent = row + 2 * S + 1;
        if (recent[0] >= wait_floor) /* the transition n observations back gets this obs as next_obs */
            memcpy(next_refs + pmod(recent[0], cap) * S, row, S * sizeof(int64_t));
        memmove(recent, recent + 1, (n - 1) * sizeof(int64_t));
        recent[n - 1] = total + i;
        if (!trusted) {
            char *mine = pending + (i * n) * fbytes;
            memmove(mine, mine + fbytes, (n - 1) * fbytes);
            memcpy(mine + (n - 1) * fbytes, frame_at(&nxt, i, S - 1), fbytes);
        }
    }
    /* ---- the counters and the caller's record, last (plain instance attributes: no Python code runs) ---- */
    int bad = PyObject_SetAttr(fstore, s_cursor, v_cursor) < 0;
    bad |= PyObject_SetAttr(fstore, s_size, v_size) < 0;
    bad |= PyObject_SetAttr(fstore, s_total_added, v_total) < 0;
    bad |= PyObject_SetAttr(storage, s_frames_written, v_fw) < 0;
    bad |= PyObject_SetAttr(storage, s_numbered, numbered) < 0;
    if (seq != Py_None) bad |= PyObject_SetAttr(storage, s_seen_seq, seq) < 0;
    bad |= PyObject_SetAttr(owner, record, Py_None) < 0;
    Py_DECREF(v_cursor), Py_DECREF(v_size), Py_DECREF(v_total), Py_DECREF(v_fw);
    if (bad) {
        Py_DECREF(v_start);
        result = NULL;
    } else {
        result = v_start;
    }
    goto done;

fallback:
    if (PyErr_Occurred()) PyErr_Clear(); /* (a field that exports no buffer: the Python path explains) */
    result = Py_None;
    Py_INCREF(result);
done:
    for (Py_ssize_t k = 0; k < got; k++) PyBuffer_Release(&fb[k]);
    if (have_obs) PyBuffer_Release(&obs);
    if (have_nxt) PyBuffer_Release(&nxt);
    return result;
}

static PyMethodDef Plan_methods[] = {
    {"step", (PyCFunction)(void (*)(void))Plan_step, METH_FASTCALL,
     "step(owner, record, storage, fields_storage, batch_fields, numbered, seq, trusted, cursor, size, total_added, "
     "frames_written, slot_numbers) -> the slots written (the first slot, an int, when the ring wraps), or None "
     "when the batch is not covered (nothing changed)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ptl_rl.buffers._frame_insert.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(pool, obs_refs, next_refs, state, pending, names, fields): a FrameStorage's arrays, held as "
              "buffers, for its compiled insert",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_frame_insert",
    "The compiled insert of ptl_rl.buffers.FrameStorage (optional: the Python path is used without it).", -1, NULL,
};

PyMODINIT_FUNC PyInit__frame_insert(void) {
    if (PyType_Ready(&PlanType) < 0) return NULL;
    const char *names[] = {"cursor", "size", "total_added", "frames_written", "_numbered", "_seen_seq", "obs",
                           "next_obs"};
    PyObject **slots[] = {&s_cursor, &s_size, &s_total_added, &s_frames_written,
                          &s_numbered, &s_seen_seq, &s_obs, &s_next_obs};
    for (int i = 0; i < 8; i++)
        if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
