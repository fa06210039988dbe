/* The compiled loops of SumTree (sumtree.py): the descent of a batch of targets and the repair after an update.
 *
 * Array kernels only: each function takes C-contiguous buffers (the buffer protocol, no numpy headers) and plain
 * integers, touches nothing else, and computes exactly what the numpy path computes (the same comparisons and the
 * same one addition per parent), so both paths give bit-identical trees and draws. See docs/design/hot-path.md
 * ("Prioritized replay").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int has_format(const Py_buffer *b, char code) {
    const char *f = b->format;
    if (f == NULL || b->itemsize != 8) return 0;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    if (code == 'q') return (f[0] == 'q' || f[0] == 'l') && f[1] == '\0';
    return f[0] == code && f[1] == '\0';
}

/* Acquire a C-contiguous 1-D buffer of 8-byte items ('d' float64 or 'q' int64); 0 on success. */
static int get_vector(PyObject *obj, Py_buffer *view, char code, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    if (view->ndim != 1 || !has_format(view, code)) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous 1-D %s array", name, code == 'd' ? "float64" : "int64");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* descend(sums, nodes, rest, levels): from top-level nodes down `levels` levels to the leaf holding each rest.
 * nodes (int64 [B]) and rest (float64 [B]) are updated in place: the leaf node and what is left of the target. */
static PyObject *descend(PyObject *self, PyObject *args) {
    PyObject *sums_obj, *nodes_obj, *rest_obj;
    Py_ssize_t levels;
    Py_buffer sums, nodes, rest;
    if (!PyArg_ParseTuple(args, "OOOn", &sums_obj, &nodes_obj, &rest_obj, &levels)) return NULL;
    if (levels < 0 || levels > 62) return PyErr_Format(PyExc_ValueError, "levels must be in [0, 62], got %zd", levels);
    if (get_vector(sums_obj, &sums, 'd', 0, "sums") < 0) return NULL;
    if (get_vector(nodes_obj, &nodes, 'q', 1, "nodes") < 0) {
        PyBuffer_Release(&sums);
        return NULL;
    }
    if (get_vector(rest_obj, &rest, 'd', 1, "rest") < 0) {
        PyBuffer_Release(&sums);
        PyBuffer_Release(&nodes);
        return NULL;
    }
    const double *s = (const double *)sums.buf;
    int64_t *node = (int64_t *)nodes.buf;
    double *u = (double *)rest.buf;
    Py_ssize_t count = nodes.shape[0];
    /* a start node n reaches (n << levels) + 2^levels - 1 at most: it must lie inside sums */
    int64_t bound = (int64_t)(sums.shape[0] >> levels);
    int ok = rest.shape[0] == count;
    for (Py_ssize_t i = 0; ok && i < count; i++) ok = node[i] > 0 && node[i] < bound;
    if (ok) {
        for (Py_ssize_t i = 0; i < count; i++) {
            int64_t n = node[i];
            double left, r = u[i];
            for (Py_ssize_t l = 0; l < levels; l++) {
                n += n;
                left = s[n];
                if (r >= left) {
                    r -= left;
                    n += 1;
                }
            }
            node[i] = n;
            u[i] = r;
        }
    }
    PyBuffer_Release(&sums);
    PyBuffer_Release(&nodes);
    PyBuffer_Release(&rest);
    if (!ok) return PyErr_Format(PyExc_IndexError, "descend: start nodes outside the tree, or rest of another length");
    Py_RETURN_NONE;
}

/* repair(sums, maxes, nodes, top): recompute the parents of `nodes` (int64 [U], leaves already written) level by
 * level up to the top level (nodes top .. 2 top - 1): each parent = its children's sum, and their maximum. */
static PyObject *repair(PyObject *self, PyObject *args) {
    PyObject *sums_obj, *maxes_obj, *nodes_obj;
    Py_ssize_t top;
    Py_buffer sums, maxes, nodes;
    if (!PyArg_ParseTuple(args, "OOOn", &sums_obj, &maxes_obj, &nodes_obj, &top)) return NULL;
    if (get_vector(sums_obj, &sums, 'd', 1, "sums") < 0) return NULL;
    if (get_vector(maxes_obj, &maxes, 'd', 1, "maxes") < 0) {
        PyBuffer_Release(&sums);
        return NULL;
    }
    if (get_vector(nodes_obj, &nodes, 'q', 0, "nodes") < 0) {
        PyBuffer_Release(&sums);
        PyBuffer_Release(&maxes);
        return NULL;
    }
    double *s = (double *)sums.buf, *m = (double *)maxes.buf;
    const int64_t *leaf = (const int64_t *)nodes.buf;
    Py_ssize_t size = sums.shape[0], count = nodes.shape[0];
    int ok = maxes.shape[0] == size && top >= 1 && 2 * top <= size;
    for (Py_ssize_t i = 0; ok && i < count; i++) ok = leaf[i] >= 2 * top && leaf[i] < size;
    if (ok) {
        for (Py_ssize_t i = 0; i < count; i++) {
            int64_t n = leaf[i] >> 1;
            while (n >= top) {
                int64_t left = n + n;
                s[n] = s[left] + s[left + 1];
                m[n] = m[left] >= m[left + 1] ? m[left] : m[left + 1];
                n >>= 1;
            }
        }
    }
    PyBuffer_Release(&sums);
    PyBuffer_Release(&maxes);
    PyBuffer_Release(&nodes);
    if (!ok) return PyErr_Format(PyExc_IndexError, "repair: leaf nodes outside the tree below the top level");
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"descend", descend, METH_VARARGS, "descend(sums, nodes, rest, levels): descend in place (see sumtree.py)."},
    {"repair", repair, METH_VARARGS, "repair(sums, maxes, nodes, top): recompute the parents of leaf nodes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sumtree_kernel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sumtree_kernel(void) { return PyModule_Create(&module); }
