/* The wire's own limit: a blaster that sends and drains datagrams as fast as the socket
 * takes them, with nothing else to do (no layout, no collective). harness/bench/blaster.py
 * runs it on every host at once; tests/benchmarks/bench_wire.py holds the collective's
 * goodput against it. A benchmark instrument, its own extension module: the data plane
 * (harness/transport/_wire.c) does not carry it. The header's layout and the GMAC are the
 * data plane's own (wire.h), so a sealed blast costs what a sealed collective's datagrams do.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "../transport/wire.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* blast(fd, peers, rank, datagram_bytes, segments, key, seconds)
 *   -> (datagrams_sent, datagrams_received, payload_bytes_received, bad_tags, seconds)
 *
 * Send datagrams of datagram_bytes (a header, then payload) to every peer in turn, 64 at a
 * time (segments > 1: messages of that many datagrams, UDP GSO; the socket must have
 * UDP_SEGMENT set to datagram_bytes), and drain this socket between batches. With a key
 * (16 bytes; None: unsealed) every datagram is sealed with it, and every one received is
 * checked with it (every blaster of a run has the same key). Received payload bytes
 * exclude the header, as a collective's goodput does. seconds 0: drain only. */
static PyObject *blast(PyObject *mod, PyObject *args) {
    int fd, rank, segments;
    Py_ssize_t dbytes;
    PyObject *peers, *key_obj;
    double seconds;
    if (!PyArg_ParseTuple(args, "iOiniOd", &fd, &peers, &rank, &dbytes, &segments, &key_obj,
                          &seconds))
        return NULL;
    if (dbytes < HEADER_BYTES || dbytes > 9000 || segments < 1 || segments > 64
        || !PyList_Check(peers) || PyList_Size(peers) < 1 || PyList_Size(peers) > 255
        || rank < 0 || rank > 255) {
        PyErr_SetString(PyExc_ValueError, "blast: datagram_bytes 72..9000, segments 1..64, "
                        "1..255 peers (a list of 16-byte sockaddr_in), rank 0..255");
        return NULL;
    }
    if (key_obj != Py_None && (!PyBytes_Check(key_obj) || PyBytes_Size(key_obj) != 16)) {
        PyErr_SetString(PyExc_ValueError, "key: 16 bytes (AES-128), or None");
        return NULL;
    }
    Py_ssize_t npeers = PyList_Size(peers);
    struct sockaddr_in to[255];
    for (Py_ssize_t i = 0; i < npeers; i++) {
        PyObject *o = PyList_GetItem(peers, i);
        if (!PyBytes_Check(o) || PyBytes_Size(o) != sizeof(struct sockaddr_in)) {
            PyErr_SetString(PyExc_ValueError, "a peer is a 16-byte sockaddr_in");
            return NULL;
        }
        memcpy(&to[i], PyBytes_AsString(o), sizeof(struct sockaddr_in));
    }
    EVP_CIPHER_CTX *mac = NULL;
    if (key_obj != Py_None) {
        mac = EVP_CIPHER_CTX_new();
        if (!mac || EVP_EncryptInit_ex(mac, EVP_aes_128_gcm(), NULL,
                                       (const unsigned char *)PyBytes_AsString(key_obj),
                                       NULL) != 1) {
            if (mac) EVP_CIPHER_CTX_free(mac);
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL could not set up AES-128-GCM");
            return NULL;
        }
    }
    enum { BATCH = 64, RX = 256, RX_SLOT = 9216 };
    uint8_t *tx = calloc(BATCH, (size_t)dbytes), *rx = malloc((size_t)RX * RX_SLOT);
    struct iovec *tiov = calloc(BATCH, sizeof(struct iovec)), *riov = calloc(RX, sizeof(struct iovec));
    struct mmsghdr *tmsg = calloc(BATCH, sizeof(struct mmsghdr)), *rmsg = calloc(RX, sizeof(struct mmsghdr));
    long long sent = 0, received = 0, rbytes = 0, bad_tags = 0;
    double t0 = now_s(), elapsed = 0;
    uint64_t seq = 0;
    int failed = !tx || !rx || !tiov || !riov || !tmsg || !rmsg;
    if (failed) PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; !failed && i < RX; i++) {
        riov[i].iov_base = rx + (size_t)i * RX_SLOT;
        riov[i].iov_len = RX_SLOT;
    }
    for (Py_ssize_t round = 0; !failed; round++) {
        int sending = (elapsed = now_s() - t0) < seconds;
        const struct sockaddr_in *dst = &to[round % npeers];
        if (!sending) goto drain;
        for (int k = 0; k < BATCH; k++) {
            uint8_t *h = tx + (size_t)k * dbytes;
            wr32(h + O_MAGIC, MAGIC);
            h[O_VERSION] = VERSION;
            wr16(h + O_SOURCE, (uint16_t)rank);
            wr32(h + O_LENGTH, (uint32_t)(dbytes - HEADER_BYTES));
            if (mac) {
                wr64(h + SEQ_OFFSET, seq);
                gmac(mac, (uint32_t)rank, seq, h, h + HEADER_BYTES,
                     (size_t)(dbytes - HEADER_BYTES), h + TAG_OFFSET);
                seq++;
            }
            tiov[k].iov_base = h;
            tiov[k].iov_len = (size_t)dbytes;
        }
        int msgs = 0;
        for (int k = 0; k < BATCH; k += segments, msgs++) {
            int pk = BATCH - k < segments ? BATCH - k : segments;
            memset(&tmsg[msgs], 0, sizeof(tmsg[msgs]));
            tmsg[msgs].msg_hdr.msg_name = (void *)dst;
            tmsg[msgs].msg_hdr.msg_namelen = sizeof(*dst);
            tmsg[msgs].msg_hdr.msg_iov = &tiov[k];
            tmsg[msgs].msg_hdr.msg_iovlen = (size_t)pk;
        }
        for (int done = 0; done < msgs;) {
            int r = sendmmsg(fd, tmsg + done, (unsigned int)(msgs - done), MSG_DONTWAIT);
            if (r > 0) {
                for (int j = done; j < done + r; j++) sent += (long long)tmsg[j].msg_hdr.msg_iovlen;
                done += r;
            } else if (errno == EAGAIN || errno == ENOBUFS || errno == EINTR) {
                break; /* full: drain our own socket, then go on */
            } else {
                failed = 2;
                break;
            }
        }
    drain:
        for (;;) {
            for (int i = 0; i < RX; i++) {
                memset(&rmsg[i].msg_hdr, 0, sizeof(struct msghdr));
                rmsg[i].msg_hdr.msg_iov = &riov[i];
                rmsg[i].msg_hdr.msg_iovlen = 1;
            }
            int r = recvmmsg(fd, rmsg, RX, MSG_DONTWAIT, NULL);
            if (r <= 0) break;
            for (int i = 0; i < r; i++) {
                size_t size = rmsg[i].msg_len;
                const uint8_t *p = riov[i].iov_base;
                if (size < HEADER_BYTES || (mac && !tag_checks(mac, p, size))) {
                    bad_tags++;
                    continue;
                }
                received++;
                rbytes += (long long)(size - HEADER_BYTES);
            }
        }
        if (!sending) break;
    }
    Py_END_ALLOW_THREADS
    int err = errno;
    free(tx); free(rx); free(tiov); free(riov); free(tmsg); free(rmsg);
    if (mac) EVP_CIPHER_CTX_free(mac);
    if (failed == 1) return NULL;
    if (failed == 2) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return Py_BuildValue("LLLLd", sent, received, rbytes, bad_tags, elapsed);
}

/* mac_cost(key, datagram_bytes, count) -> (seal_s, check_s): seconds to seal `count`
 * datagrams of datagram_bytes with the data plane's GMAC, and to check them, on this core
 * (no system calls). */
static PyObject *mac_cost(PyObject *mod, PyObject *args) {
    Py_buffer key;
    Py_ssize_t dbytes, count;
    if (!PyArg_ParseTuple(args, "y*nn", &key, &dbytes, &count)) return NULL;
    if (key.len != 16 || dbytes < HEADER_BYTES || dbytes > MAX_UDP_PAYLOAD || count < 1) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "mac_cost(key: 16 bytes, datagram_bytes, count)");
        return NULL;
    }
    EVP_CIPHER_CTX *mac = EVP_CIPHER_CTX_new();
    int ready = mac && EVP_EncryptInit_ex(mac, EVP_aes_128_gcm(), NULL, key.buf, NULL) == 1;
    PyBuffer_Release(&key);
    uint8_t *d = ready ? calloc(1, (size_t)dbytes) : NULL;
    if (!d) {
        if (mac) EVP_CIPHER_CTX_free(mac);
        return ready ? PyErr_NoMemory()
                     : (PyErr_SetString(PyExc_RuntimeError, "OpenSSL: no AES-128-GCM"), NULL);
    }
    int ok = 1;
    double t0, seal_s, check_s;
    Py_BEGIN_ALLOW_THREADS
    t0 = now_s();
    for (Py_ssize_t i = 0; i < count; i++) {
        wr64(d + SEQ_OFFSET, (uint64_t)i);
        gmac(mac, 1, (uint64_t)i, d, d + HEADER_BYTES, (size_t)(dbytes - HEADER_BYTES),
             d + TAG_OFFSET);
    }
    seal_s = now_s() - t0;
    t0 = now_s();
    for (Py_ssize_t i = 0; i < count; i++) ok &= tag_checks(mac, d, (size_t)dbytes);
    check_s = now_s() - t0;
    Py_END_ALLOW_THREADS
    free(d);
    EVP_CIPHER_CTX_free(mac);
    (void)ok; /* (computed so that the checks are not optimised away) */
    return Py_BuildValue("dd", seal_s, check_s);
}

static PyMethodDef module_methods[] = {
    {"blast", blast, METH_VARARGS, "Send and drain as fast as the wire goes."},
    {"mac_cost", mac_cost, METH_VARARGS, "Seconds to seal and to check a number of datagrams."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef blaster_module = {
    PyModuleDef_HEAD_INIT, "_blaster", "The wire's own limit (see the C source).", -1,
    module_methods};

PyMODINIT_FUNC PyInit__blaster(void) { return PyModule_Create(&blaster_module); }
