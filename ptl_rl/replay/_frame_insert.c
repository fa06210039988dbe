/* The compiled insert of FrameStorage: an array kernel that writes one batch into the storage's arrays.
 *
 * Plain CPython C API and the buffer protocol (PyObject_GetBuffer), no numpy headers and no numpy object
 * layout: the build needs setuptools and a C compiler only, and the module does not depend on a numpy version.
 * It reads and writes no Python attributes: the caller (ptl_rl/replay/frames/compiled.py) passes the batch's
 * dict of arrays, the state arrays and integers, and commits the bookkeeping (counters, journal, ...) itself
 * once the kernel returned. The batch's keys are data handed over at bind time (str objects the Kernel holds).
 * See docs/design/pixel-replay.md ("Compiled insert") for what is covered and why an interrupt cannot split it.
 *
 * A Kernel holds the storage's long-lived arrays (pool, frame references, pending frames, the frame watermark,
 * the other fields' rings, the per-env state and its spare) as buffers acquired once. Kernel.insert(...) takes
 * the batch's dict, checks it against them and either changes nothing and returns -1 (not covered: the caller
 * takes the Python path), or writes the whole batch and returns the number of rows written. Every check comes before the first write, and no Python code runs
 * inside the call, so a KeyboardInterrupt lands before it or after all of it.
 *
 * What it writes, and why an uncommitted insert is harmless: the per-env state goes into the spare array (the
 * caller swaps it in when it commits); the pool frames go to positions the watermark (frames_written, a
 * one-element int64 array) already counts, advanced in the same call, as the Python path advances it before
 * writing; the batch's slots get next_refs = -1 before their fields change. Until the caller commits, the
 * counters and the per-env state still describe the storage before the batch, so redoing the batch from them
 * gives what one uninterrupted insert gives.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <immintrin.h> /* streaming stores of pool frames (see copy_frame) */
#endif

#define MAXDIM 16
#define MAXFIELDS 64

typedef struct {
    PyObject_HEAD
    Py_buffer pool, obs_refs, next_refs, pending, watermark;
    int held; /* how many of the five buffers above are held (acquired in that order) */
    Py_ssize_t nfields, fields_held;
    Py_buffer *fields;
    PyObject *keys[MAXFIELDS + 2]; /* the batch's keys (str, given at bind): obs, next_obs, then the fields' */
    Py_ssize_t keys_held;
    /* the per-env state and its spare, held across calls: they swap roles at every commit, so a call names
     * which is which by passing the objects, and any other object is exported for that call only */
    PyObject *state_obj[2];
    Py_buffer state_buf[2];
    int states_held;
    Py_ssize_t row_bytes[MAXFIELDS];
    Py_ssize_t env_k, terminated_k, truncated_k; /* positions of those fields among the fields */
    Py_ssize_t S, n, W, E, capacity, pool_size, frame_bytes, frame_ndim, itemsize;
    Py_ssize_t frame_shape[MAXDIM];
} Kernel;

static void release_kernel(Kernel *p) {
    Py_buffer *own[5] = {&p->pool, &p->obs_refs, &p->next_refs, &p->pending, &p->watermark};
    for (int i = 0; i < p->held; i++) PyBuffer_Release(own[i]);
    p->held = 0;
    for (Py_ssize_t k = 0; k < p->fields_held; k++) PyBuffer_Release(&p->fields[k]);
    p->fields_held = 0;
    PyMem_Free(p->fields);
    p->fields = NULL;
    for (Py_ssize_t k = 0; k < p->keys_held; k++) Py_CLEAR(p->keys[k]);
    p->keys_held = 0;
    for (int i = 0; i < p->states_held; i++) {
        PyBuffer_Release(&p->state_buf[i]);
        Py_CLEAR(p->state_obj[i]);
    }
    p->states_held = 0;
}

static void Kernel_dealloc(Kernel *p) {
    release_kernel(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int is_int64(const Py_buffer *b) {
    return b->itemsize == 8 && b->format != NULL && (strcmp(b->format, "l") == 0 || strcmp(b->format, "q") == 0 ||
                                                     strcmp(b->format, "<l") == 0 || strcmp(b->format, "<q") == 0);
}

static int same_format(const Py_buffer *a, const Py_buffer *b) {
    /* (formats of plain dtypes are one character: compared inline before any call) */
    return a->itemsize == b->itemsize && a->format != NULL && b->format != NULL && a->format[0] == b->format[0] &&
           (a->format[0] == '\0' || a->format[1] == b->format[1]) &&
           (a->format[0] == '\0' || a->format[1] == '\0' || strcmp(a->format, b->format) == 0);
}

static int kernel_error(const char *what) {
    PyErr_Format(PyExc_ValueError, "_frame_insert.Kernel: %s", what);
    return -1;
}

#define WRITABLE_ARRAY (PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE)

/* a per-env state array: int64 [E, W] */
static int state_ok(const Kernel *p, const Py_buffer *b) {
    return b->ndim == 2 && is_int64(b) && b->shape[0] == p->E && b->shape[1] == p->W;
}

/* Kernel(pool, obs_refs, next_refs, pending, watermark, fields, keys, state, spare, env_k, terminated_k,
 *        truncated_k, n) */
static int Kernel_init(Kernel *p, PyObject *args, PyObject *kwds) {
    PyObject *pool, *obs_refs, *next_refs, *pending, *watermark, *fields, *keys, *state, *spare;
    Py_ssize_t env_k, terminated_k, truncated_k, n;
    if (kwds != NULL && PyDict_Size(kwds) > 0) return kernel_error("takes positional arguments only");
    if (!PyArg_ParseTuple(args, "OOOOOO!O!OOnnnn", &pool, &obs_refs, &next_refs, &pending, &watermark,
                          &PyTuple_Type, &fields, &PyTuple_Type, &keys, &state, &spare, &env_k, &terminated_k,
                          &truncated_k, &n))
        return -1;
    release_kernel(p);
    PyObject *arrays[5] = {pool, obs_refs, next_refs, pending, watermark};
    Py_buffer *own[5] = {&p->pool, &p->obs_refs, &p->next_refs, &p->pending, &p->watermark};
    for (int i = 0; i < 5; i++) {
        if (PyObject_GetBuffer(arrays[i], own[i], WRITABLE_ARRAY) < 0) return -1;
        p->held = i + 1;
    }
    if (p->pool.ndim < 1 || p->pool.ndim > MAXDIM - 2) return kernel_error("pool must be [pool_size, *frame]");
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
        return kernel_error("obs_refs and next_refs must be int64 [capacity, S]");
    p->capacity = p->obs_refs.shape[0];
    p->S = p->obs_refs.shape[1];
    if (n < 1) return kernel_error("n must be >= 1");
    p->n = n;
    p->W = 2 * p->S + 2 + n; /* the per-env state's columns: last, final, trust, recent [n], head */
    if (p->watermark.ndim != 1 || p->watermark.shape[0] != 1 || !is_int64(&p->watermark))
        return kernel_error("watermark must be int64 [1]");
    if (p->pending.ndim != p->pool.ndim + 2 || !same_format(&p->pending, &p->pool) || p->pending.shape[1] != n + 1 ||
        p->pending.shape[2] != p->S)
        return kernel_error("pending must be [E, n + 1, S, *frame] of the pool's dtype");
    for (int d = 1; d < p->pool.ndim; d++)
        if (p->pending.shape[d + 2] != p->pool.shape[d]) return kernel_error("pending frames differ from the pool's");
    p->E = p->pending.shape[0];
    p->nfields = PyTuple_GET_SIZE(fields);
    if (p->nfields > MAXFIELDS) return kernel_error("at most 64 fields");
    p->fields = PyMem_Calloc(p->nfields ? p->nfields : 1, sizeof(Py_buffer));
    if (p->fields == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < p->nfields; k++) {
        Py_buffer *f = &p->fields[k];
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(fields, k), f, WRITABLE_ARRAY) < 0) return -1;
        p->fields_held = k + 1;
        if (f->ndim < 1 || f->shape[0] != p->capacity) return kernel_error("every field must be [capacity, ...]");
        p->row_bytes[k] = f->len / p->capacity;
    }
    p->env_k = env_k, p->terminated_k = terminated_k, p->truncated_k = truncated_k;
    if (env_k < 0 || env_k >= p->nfields || terminated_k < 0 || terminated_k >= p->nfields || truncated_k < 0 ||
        truncated_k >= p->nfields)
        return kernel_error("env_k, terminated_k and truncated_k must be positions among the fields");
    if (!is_int64(&p->fields[env_k]) || p->fields[env_k].ndim != 1 || p->fields[terminated_k].itemsize != 1 ||
        p->fields[terminated_k].ndim != 1 || p->fields[truncated_k].itemsize != 1 || p->fields[truncated_k].ndim != 1)
        return kernel_error("env_id must be int64 [capacity], terminated and truncated bool [capacity]");
    if (PyTuple_GET_SIZE(keys) != p->nfields + 2) return kernel_error("keys must be (obs, next_obs, *fields' keys)");
    for (Py_ssize_t k = 0; k < p->nfields + 2; k++) {
        PyObject *key = PyTuple_GET_ITEM(keys, k);
        if (!PyUnicode_CheckExact(key)) return kernel_error("keys must be str");
        for (Py_ssize_t j = 0; j < k; j++)
            if (PyUnicode_Compare(key, p->keys[j]) == 0) return kernel_error("keys must differ");
        Py_INCREF(key);
        p->keys[k] = key;
        p->keys_held = k + 1;
    }
    PyObject *states[2] = {state, spare};
    for (int i = 0; i < 2; i++) {
        if (PyObject_GetBuffer(states[i], &p->state_buf[i], WRITABLE_ARRAY) < 0) return -1;
        Py_INCREF(states[i]);
        p->state_obj[i] = states[i];
        p->states_held = i + 1;
        if (!state_ok(p, &p->state_buf[i])) return kernel_error("state and spare must be int64 [E, W]");
    }
    if (p->state_buf[0].buf == p->state_buf[1].buf) return kernel_error("state and spare must not share memory");
    return 0;
}

/* obs-shaped batch [count, S, *frame] of the pool's dtype whose frames are C-contiguous (any row/stack strides) */
static int obs_layout_ok(const Kernel *p, const Py_buffer *b) {
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

/* the pool ring and its running frames_written */
typedef struct {
    char *pool;
    Py_ssize_t P, fbytes, S;
    int64_t fw;
} Pool;

/* Copy one frame into the pool. A frame is read again only when it is sampled, long after (the pool is far
 * larger than the caches in any replay that matters), so on x86-64 whole 16-byte blocks are written with
 * streaming (non-temporal) stores: no read of the destination's cache lines before writing them, and no
 * eviction of the lines this add reads next. Where the CPU has AVX (checked once, at import), 32-byte stores
 * four at a time: on the machine of benchmarks/pixels.py that copies 8 Atari frames into a cold pool in
 * ~5.9 us, against ~7.8 us for memcpy and ~7.2 us for the 16-byte loop. Other targets, and frames not in
 * 16-byte blocks, take memcpy. */
#if defined(__SSE2__) && defined(__GNUC__)
#define HAVE_AVX_DISPATCH 1
static int cpu_has_avx; /* set by the module's init */

__attribute__((target("avx"))) static void stream_copy_avx(char *dst, const char *src, Py_ssize_t bytes) {
    Py_ssize_t k = 0;
    if ((uintptr_t)dst & 31) { /* (32-byte stores need 32-byte alignment: one 16-byte store first) */
        _mm_stream_si128((__m128i *)dst, _mm_loadu_si128((const __m128i *)src));
        k = 16;
    }
    for (; k + 128 <= bytes; k += 128) { /* (four loads before four stores: the loads overlap) */
        __m256i a = _mm256_loadu_si256((const __m256i *)(src + k));
        __m256i b = _mm256_loadu_si256((const __m256i *)(src + k + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(src + k + 64));
        __m256i d = _mm256_loadu_si256((const __m256i *)(src + k + 96));
        _mm256_stream_si256((__m256i *)(dst + k), a);
        _mm256_stream_si256((__m256i *)(dst + k + 32), b);
        _mm256_stream_si256((__m256i *)(dst + k + 64), c);
        _mm256_stream_si256((__m256i *)(dst + k + 96), d);
    }
    for (; k + 32 <= bytes; k += 32)
        _mm256_stream_si256((__m256i *)(dst + k), _mm256_loadu_si256((const __m256i *)(src + k)));
    for (; k < bytes; k += 16) _mm_stream_si128((__m128i *)(dst + k), _mm_loadu_si128((const __m128i *)(src + k)));
}
#endif

static inline void copy_frame(char *dst, const char *src, Py_ssize_t bytes) {
#if defined(__SSE2__)
    if (((uintptr_t)dst & 15) == 0 && (bytes & 15) == 0) {
#if defined(HAVE_AVX_DISPATCH)
        if (cpu_has_avx) {
            stream_copy_avx(dst, src, bytes);
            return;
        }
#endif
        for (Py_ssize_t k = 0; k < bytes; k += 16)
            _mm_stream_si128((__m128i *)(dst + k), _mm_loadu_si128((const __m128i *)(src + k)));
        return;
    }
#endif
    memcpy(dst, src, bytes);
}

/* FrameStorage._write_frames of one frame: its absolute position */
static inline int64_t put(Pool *pl, const char *src) {
    copy_frame(pl->pool + pmod(pl->fw, pl->P) * pl->fbytes, src, pl->fbytes);
    return pl->fw++;
}

/* FrameStorage._insert_stacks: the stacks of src rows `rows` (R of them) against their env's previous stacks
 * prev[a] (S positions each); known[a] (NULL: none) marks trusted rows. Writes the references (refs, R x S) and
 * whether each row continued its previous stack (cont), writing frames in the order the Python path does. */
static void insert_stacks(Pool *pl, const Py_buffer *src, const Py_ssize_t *rows, Py_ssize_t R, int64_t *const *prev,
                          const char *known, int64_t *refs, char *cont) {
    const Py_ssize_t S = pl->S, fb = pl->fbytes;
    const int64_t floor = pl->fw + R * S - pl->P > 0 ? pl->fw + R * S - pl->P : 0; /* survive this insert */
    for (Py_ssize_t a = 0; a < R; a++) { /* every comparison before the first write, as there */
        int alive = 1;
        for (Py_ssize_t j = 0; j < S && alive; j++) alive = prev[a][j] >= floor;
        int c = alive;
        if (alive && !(known != NULL && known[a]))
            for (Py_ssize_t j = 0; j + 1 < S && c; j++)
                c = memcmp(pl->pool + pmod(prev[a][j + 1], pl->P) * fb, frame_at(src, rows[a], j), fb) == 0;
        cont[a] = (char)c;
    }
    for (Py_ssize_t a = 0; a < R; a++) {
        int64_t *out = refs + a * S;
        if (cont[a]) { /* one new frame */
            memcpy(out, prev[a] + 1, (S - 1) * sizeof(int64_t));
            out[S - 1] = put(pl, frame_at(src, rows[a], S - 1));
            continue;
        }
        /* each frame that differs from the next one in its stack; a repeated frame refers to the next written */
        for (Py_ssize_t j = 0; j < S; j++) {
            const char *frame = frame_at(src, rows[a], j);
            int written = j == S - 1 || memcmp(frame, frame_at(src, rows[a], j + 1), fb) != 0;
            out[j] = written ? put(pl, frame) : INT64_MAX;
        }
        for (Py_ssize_t j = S - 2; j >= 0; j--)
            if (out[j + 1] < out[j]) out[j] = out[j + 1];
    }
}

/* insert(batch, state, spare, trusted, cursor, total_added)
 *   batch: the batch's dict of arrays (TransitionBatch._fields), exactly the keys the Kernel was built with
 *   state: the committed per-env state, int64 [E, W] (read only); spare: the same shape, gets the new state
 *     (both held since the bind when they are the arrays given there, in either role)
 *   cursor, total_added: the storage's counters before the batch
 * -> the number of rows written, or -1: not covered, nothing changed */
static PyObject *Kernel_insert(Kernel *p, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "insert takes 6 arguments");
        return NULL;
    }
    if (p->held != 5 || p->states_held != 2) {
        PyErr_SetString(PyExc_RuntimeError, "_frame_insert.Kernel is not initialised");
        return NULL;
    }
    PyObject *data = args[0];
    int trusted = PyObject_IsTrue(args[3]);
    long long cursor = PyLong_AsLongLong(args[4]), total = PyLong_AsLongLong(args[5]);
    if (trusted < 0 || PyErr_Occurred()) return NULL;
    const Py_ssize_t nkeys = p->nfields + 2;
    /* another key, or one missing: the Python path refuses (or stores) it */
    if (!PyDict_CheckExact(data) || PyDict_GET_SIZE(data) != nkeys) return PyLong_FromLong(-1);
    if (cursor < 0 || cursor >= p->capacity || total < 0) return PyLong_FromLong(-1);

    PyObject *item[MAXFIELDS + 2]; /* (owned while the call runs: an exporter could in theory run Python code) */
    Py_ssize_t items = 0;
    Py_buffer obs = {0}, nxt = {0}, st_own = {0}, sp_own = {0};
    const Py_buffer *st = NULL;
    Py_buffer *sp = NULL;
    void *work = NULL;
    Py_ssize_t scratch[512]; /* 4 KiB */
    Py_buffer fb[MAXFIELDS];
    Py_ssize_t got = 0; /* field buffers taken */
    int have_obs = 0, have_nxt = 0, have_st = 0, have_sp = 0;
    long long written = -1; /* not covered unless every check passes */
    for (; items < nkeys; items++) {
        item[items] = PyDict_GetItemWithError(data, p->keys[items]);
        if (item[items] == NULL) goto fallback;
        Py_INCREF(item[items]);
    }
    if (PyObject_GetBuffer(item[0], &obs, PyBUF_RECORDS_RO) < 0) goto fallback;
    have_obs = 1;
    if (PyObject_GetBuffer(item[1], &nxt, PyBUF_RECORDS_RO) < 0) goto fallback;
    have_nxt = 1;
    if (!obs_layout_ok(p, &obs) || !obs_layout_ok(p, &nxt)) goto fallback;
    const Py_ssize_t count = obs.shape[0], S = p->S, W = p->W, n = p->n, cap = p->capacity, P = p->pool_size;
    if (count < 1 || count > cap || count > P || nxt.shape[0] != count) goto fallback;
#if defined(__SSE2__)
    /* The newest frame of each row is the one a trusted step copies, from where the batch left it: often not in
     * cache, 8 separate places (one per env) that the hardware prefetcher cannot guess. Asking for the head of
     * each (4 cache lines, into L2) before the exports and the bookkeeping below lets those misses, and the page
     * walks to reach them, overlap that work: ~0.2 us an add of 8 Atari frames (benchmarks/pixels.py, A/B in one
     * process). More lines (16, or whole frames) and prefetching ahead inside the copy measured slower. */
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *head = frame_at(&obs, i, S - 1);
        for (Py_ssize_t b = 0; b < 4 * 64 && b < p->frame_bytes; b += 64) _mm_prefetch(head + b, _MM_HINT_T1);
    }
#endif
    for (Py_ssize_t k = 0; k < p->nfields; k++) {
        if (PyObject_GetBuffer(item[k + 2], &fb[k], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto fallback;
        got = k + 1;
        const Py_buffer *f = &p->fields[k];
        if (fb[k].ndim != f->ndim || fb[k].shape[0] != count || !same_format(&fb[k], f)) goto fallback;
        for (int dim = 1; dim < f->ndim; dim++)
            if (fb[k].shape[dim] != f->shape[dim]) goto fallback;
    }
    if (args[1] == p->state_obj[0] && args[2] == p->state_obj[1]) {
        st = &p->state_buf[0], sp = &p->state_buf[1];
    } else if (args[1] == p->state_obj[1] && args[2] == p->state_obj[0]) {
        st = &p->state_buf[1], sp = &p->state_buf[0];
    } else { /* arrays other than those held: exported for this call (checked as the held ones were) */
        if (PyObject_GetBuffer(args[1], &st_own, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fallback;
        have_st = 1;
        if (PyObject_GetBuffer(args[2], &sp_own, WRITABLE_ARRAY) < 0) goto fallback;
        have_sp = 1;
        if (!state_ok(p, &st_own) || !state_ok(p, &sp_own) || sp_own.buf == st_own.buf) goto fallback;
        st = &st_own, sp = &sp_own;
    }
    /* rows of an env in time order, any interleaving; env ids inside the per-env state */
    const int64_t *env = (const int64_t *)fb[p->env_k].buf;
    const char *term = (const char *)fb[p->terminated_k].buf, *trunc = (const char *)fb[p->truncated_k].buf;
    if (count * S * 2 > P) goto fallback; /* (the Python path explains a pool too small for one batch) */
    /* scratch: rank, rows (twice: the finals' fresh rows follow a group), seen (per env), prev, refs, 3 flags */
    const size_t work_bytes = (3 * count + p->E) * sizeof(Py_ssize_t) + count * sizeof(int64_t *) +
                              count * S * sizeof(int64_t) + 3 * count;
    /* (a vector step of a few dozen envs fits on the stack: no allocation on the common add) */
    work = work_bytes <= sizeof(scratch) ? (void *)scratch : PyMem_Malloc(work_bytes);
    if (work == NULL) goto fallback;
    Py_ssize_t *rank = (Py_ssize_t *)work, *rows = rank + count, *seen = rows + 2 * count;
    int64_t **prev = (int64_t **)(seen + p->E);
    int64_t *refs = (int64_t *)(prev + count);
    char *done = (char *)(refs + count * S), *cont = done + count, *known = cont + count;
    memset(seen, 0, p->E * sizeof(Py_ssize_t));
    Py_ssize_t groups = 1, ended = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (env[i] < 0 || env[i] >= p->E) goto fallback;
        rank[i] = seen[env[i]]++;
        if (rank[i] + 1 > groups) groups = rank[i] + 1;
        done[i] = term[i] || trunc[i];
        ended += done[i];
    }
    const int any_done = ended > 0;
    /* checked mode, an env twice: its second pending write overwrites a stack the add compared, which the Python
     * path backs up for a caller that rolls the add back (a SequenceReplayBuffer's redo) */
    if (!trusted && groups > 1) goto fallback;
    /* the new per-env state starts as the committed one; from here on `state` is the spare */
    memcpy(sp->buf, st->buf, p->E * W * sizeof(int64_t));
    int64_t *state = (int64_t *)sp->buf;
    int64_t *obs_refs = (int64_t *)p->obs_refs.buf, *next_refs = (int64_t *)p->next_refs.buf;
    char *pending = (char *)p->pending.buf;
    const Py_ssize_t fbytes = p->frame_bytes;
    const int64_t total2 = total + count;
    const int64_t wait_floor = total2 - cap > 0 ? total2 - cap : 0;
    if (!trusted) { /* checked: a resolved next_obs must be this obs, whole stack (FrameStorage._check_next_obs) */
        /* Checked before any write, for every group at once: at an env's k-th row of this batch its shift
         * registers hold, oldest first, the stored entries k.. and then what its rows k-n.. put there, so
         * the entry compared is the stored k-th (k < n) or the one from its row k - n of this batch. */
        Py_ssize_t *hist = PyMem_Malloc((p->E * n + 1) * sizeof(Py_ssize_t)); /* an env's last n rows */
        if (hist == NULL) goto fallback;
        memset(seen, 0, p->E * sizeof(Py_ssize_t));
        int bad = 0;
        for (Py_ssize_t i = 0; i < count && !bad; i++) {
            const Py_ssize_t e = env[i], k = seen[e]++;
            const Py_ssize_t back = k >= n ? hist[e * n + (k - n) % n] : -1; /* this env's row k - n */
            hist[e * n + k % n] = i;
            const int64_t *row = state + e * W;
            const int64_t gen = back < 0 ? row[2 * S + 1 + k] : (done[back] ? -1 : total + back);
            /* (the stored pending stack, when back < 0: the k-th oldest of the env's ring of n + 1, from its head) */
            const char *kept = pending + (e * (n + 1) + (row[2 * S + 1 + n] + k) % (n + 1)) * S * fbytes;
            for (Py_ssize_t j = 0; j < S && !bad && gen >= wait_floor; j++) {
                const char *want = back < 0 ? kept + j * fbytes : frame_at(&nxt, back, j);
                bad = memcmp(want, frame_at(&obs, i, j), fbytes) != 0;
            }
        }
        PyMem_Free(hist);
        if (bad) goto fallback; /* (the Python path refuses the batch, naming the env and the transition) */
    }

    /* ---- writes, in the order of the Python path (frames/insert.py); nothing below can fail ---- */
    int64_t *watermark = (int64_t *)p->watermark.buf;
    const int64_t fw0 = *watermark;
    Pool pl = {(char *)p->pool.buf, P, fbytes, S, fw0};
    const long long end = cursor + count;
    for (Py_ssize_t i = 0; i < count; i++) next_refs[pmod(cursor + i, cap) * S] = -1;
    for (Py_ssize_t k = 0; k < p->nfields; k++) { /* ArrayStorage.add: one or two slice copies */
        const Py_ssize_t rb = p->row_bytes[k];
        const Py_ssize_t first = end <= cap ? count : cap - cursor;
        memcpy((char *)p->fields[k].buf + cursor * rb, fb[k].buf, first * rb);
        if (first < count) memcpy(p->fields[k].buf, (const char *)fb[k].buf + first * rb, (count - first) * rb);
    }
    for (Py_ssize_t g = 0; g < groups; g++) { /* _add_obs per group of rows in which each env occurs once */
        Py_ssize_t R = 0;
        for (Py_ssize_t i = 0; i < count; i++)
            if (rank[i] == g) rows[R++] = i;
        const int64_t floor1 = pl.fw + R - P > 0 ? pl.fw + R - P : 0;
        int all_trusted = trusted;
        for (Py_ssize_t a = 0; a < R && all_trusted; a++) {
            const int64_t *row = state + env[rows[a]] * W;
            if (row[2 * S] != 1) all_trusted = 0;
            for (Py_ssize_t j = 0; j < S && all_trusted; j++)
                if (row[j] < floor1) all_trusted = 0;
        }
        if (all_trusted) { /* the trusted step: the newest frame, the references shifted */
            for (Py_ssize_t a = 0; a < R; a++) {
                int64_t *row = state + env[rows[a]] * W;
                const int64_t pos = put(&pl, frame_at(&obs, rows[a], S - 1));
                memmove(row, row + 1, (S - 1) * sizeof(int64_t));
                row[S - 1] = pos;
                if (any_done) row[2 * S] = !done[rows[a]];
            }
        } else {
            for (Py_ssize_t a = 0; a < R; a++) {
                int64_t *row = state + env[rows[a]] * W;
                prev[a] = row;
                known[a] = trusted && row[2 * S] == 1;
            }
            insert_stacks(&pl, &obs, rows, R, prev, trusted ? known : NULL, refs, cont);
            for (Py_ssize_t a = 0; a < R; a++) {
                int64_t *row = state + env[rows[a]] * W;
                memcpy(row, refs + a * S, S * sizeof(int64_t));
                row[2 * S] = cont[a] && !done[rows[a]];
            }
        }
        for (Py_ssize_t a = 0; a < R; a++) {
            const Py_ssize_t i = rows[a];
            int64_t *row = state + env[i] * W;
            memcpy(obs_refs + pmod(cursor + i, cap) * S, row, S * sizeof(int64_t));
            int64_t *recent = row + 2 * S + 1;
            if (!trusted) { /* this row's next_obs into the free position of the env's ring, after its newest */
                int64_t *head = row + 2 * S + 1 + n;
                char *mine = pending + (env[i] * (n + 1) + (*head + n) % (n + 1)) * S * fbytes;
                for (Py_ssize_t j = 0; j < S; j++) memcpy(mine + j * fbytes, frame_at(&nxt, i, j), fbytes);
                *head = (*head + 1) % (n + 1);
            }
            if (recent[0] >= wait_floor) /* the transition n observations back gets this obs as next_obs */
                memcpy(next_refs + pmod(recent[0], cap) * S, row, S * sizeof(int64_t));
            memmove(recent, recent + 1, (n - 1) * sizeof(int64_t));
            recent[n - 1] = done[i] ? -1 : total + i; /* an ended transition waits for nothing */
        }
    }
    if (any_done) { /* _add_finals per group of ended rows in which each env occurs once */
        memset(seen, 0, p->E * sizeof(Py_ssize_t));
        Py_ssize_t fgroups = 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            rank[i] = done[i] ? seen[env[i]]++ : -1;
            if (rank[i] + 1 > fgroups) fgroups = rank[i] + 1;
        }
        for (Py_ssize_t g = 0; g < fgroups; g++) {
            Py_ssize_t R = 0;
            for (Py_ssize_t i = 0; i < count; i++)
                if (rank[i] == g) rows[R++] = i;
            /* the env's cached final stack is this one (an episode's tails share it) if still pooled and equal */
            const int64_t floor_f = pl.fw + R * S - P > 0 ? pl.fw + R * S - P : 0;
            Py_ssize_t fresh_count = 0;
            for (Py_ssize_t a = 0; a < R; a++) {
                const int64_t *fin = state + env[rows[a]] * W + S;
                int same = 1;
                for (Py_ssize_t j = 0; j < S && same; j++) same = fin[j] >= floor_f;
                for (Py_ssize_t j = 0; j < S && same; j++)
                    same = memcmp(pl.pool + pmod(fin[j], P) * fbytes, frame_at(&nxt, rows[a], j), fbytes) == 0;
                cont[a] = (char)same; /* (here: reuse the cached final) */
                if (!same) {
                    rows[R + fresh_count] = rows[a]; /* (rows has room: R + fresh <= count) */
                    fresh_count++;
                }
            }
            Py_ssize_t *new_rows = rows + R;
            char *same_of = cont;
            /* the others: stacks inserted as for an observation (compared with the env's last stack) */
            char *cont_new = known;
            for (Py_ssize_t a = 0; a < fresh_count; a++) prev[a] = state + env[new_rows[a]] * W;
            if (fresh_count) insert_stacks(&pl, &nxt, new_rows, fresh_count, prev, NULL, refs, cont_new);
            Py_ssize_t f = 0;
            for (Py_ssize_t a = 0; a < R; a++) {
                const Py_ssize_t i = rows[a];
                int64_t *fin = state + env[i] * W + S;
                if (!same_of[a]) memcpy(fin, refs + (f++) * S, S * sizeof(int64_t));
                memcpy(next_refs + pmod(cursor + i, cap) * S, fin, S * sizeof(int64_t));
            }
        }
        /* an env whose last row in this batch ended its episode: its newest observation is the final one */
        for (Py_ssize_t i = 0; i < count; i++) seen[env[i]] = i; /* (later rows win) */
        for (Py_ssize_t i = 0; i < count; i++)
            if (done[i] && seen[env[i]] == i) memcpy(state + env[i] * W, state + env[i] * W + S, S * sizeof(int64_t));
    }
    *watermark = pl.fw; /* (the same call: no stack can be rebuilt from a frame it overwrote) */
#if defined(__SSE2__)
    _mm_sfence(); /* (the streaming stores of copy_frame are ordered before anything after the call) */
#endif
    written = count;

fallback:
    if (PyErr_Occurred()) PyErr_Clear(); /* (an array that exports no buffer, a key that hashes oddly: Python) */
    if (work != (void *)scratch) PyMem_Free(work);
    for (Py_ssize_t k = 0; k < got; k++) PyBuffer_Release(&fb[k]);
    if (have_obs) PyBuffer_Release(&obs);
    if (have_nxt) PyBuffer_Release(&nxt);
    if (have_st) PyBuffer_Release(&st_own);
    if (have_sp) PyBuffer_Release(&sp_own);
    for (Py_ssize_t k = 0; k < items; k++) Py_DECREF(item[k]);
    return PyLong_FromLongLong(written);
}

static PyMethodDef Kernel_methods[] = {
    {"insert", (PyCFunction)(void (*)(void))Kernel_insert, METH_FASTCALL,
     "insert(batch, state, spare, trusted, cursor, total_added) -> rows written, or -1 when the batch is not "
     "covered (nothing changed). batch: the batch's dict of arrays, with exactly the keys of the bind; the new "
     "per-env state goes into spare."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ptl_rl.replay._frame_insert.Kernel",
    .tp_basicsize = sizeof(Kernel),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Kernel(pool, obs_refs, next_refs, pending, watermark, fields, keys, state, spare, env_k, "
              "terminated_k, truncated_k, n): a FrameStorage's arrays, held as buffers, for its compiled insert",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Kernel_init,
    .tp_dealloc = (destructor)Kernel_dealloc,
    .tp_methods = Kernel_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_frame_insert",
    "The compiled insert of ptl_rl.replay.FrameStorage (optional: the Python path is used without it).", -1, NULL,
};

PyMODINIT_FUNC PyInit__frame_insert(void) {
#if defined(HAVE_AVX_DISPATCH)
    __builtin_cpu_init();
    cpu_has_avx = __builtin_cpu_supports("avx");
#endif
    if (PyType_Ready(&KernelType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&KernelType);
    if (PyModule_AddObject(m, "Kernel", (PyObject *)&KernelType) < 0) {
        Py_DECREF(&KernelType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
