/* The per-datagram work of lossbed's UDP data plane, one call per batch.
 *
 * Python keeps the policy (layouts, deadlines, estimators, counters, the drop mask); this
 * file only moves and checks bytes: it builds and seals the headers of a batch of packets
 * and sends them (UDP GSO where the socket has it, sendmmsg otherwise), receives a batch
 * with recvmmsg, screens it (is it this job's, from the peer it names, sealed with that
 * peer's key, addressed to this rank), and applies the data packets of one stage: checks
 * each against what the receiver itself expects, refuses non-finite values and duplicates,
 * and adds or copies the payload into the destination tensor.
 *
 * Everything from the wire is hostile: every length and index read from a datagram is
 * checked against the receiver's own arrays before it indexes anything, and nothing a
 * datagram says sizes an allocation. harness/transport/header.py is the definition of the
 * header; native.py checks at import that the constants below agree with it.
 *
 * The MAC is GMAC: AES-128-GCM (OpenSSL's EVP) with the whole datagram as additional data
 * and nothing to encrypt, the tag field taken as zero. Nonce: source rank (4 bytes, big
 * endian) then seq (8 bytes): auth.py says why it never repeats. The header's layout and
 * the GMAC are wire.h's, shared with the blaster (harness/bench/_blaster.c).
 *
 * Why one file of this length: the sender, the screen, apply and in_order share the
 * header's field access and the MAC in one translation unit, where the compiler inlines
 * them into the per-datagram loops; each part is one section below (the MAC, sending,
 * receiving, the screen, RC's in_order, apply), and native.py is the named face of each.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "wire.h"

/* what screen() says of a received datagram */
enum { CLS_FOREIGN = 0, CLS_UNAUTHENTICATED = 1, CLS_MISDIRECTED = 2, CLS_TRUNCATED = 3,
       CLS_DATA = 4, CLS_OTHER = 5 };

typedef struct {
    PyObject_HEAD
    EVP_CIPHER_CTX *ctx;
} MacObject;

static PyTypeObject MacType;

static int Mac_init(MacObject *self, PyObject *args, PyObject *kwds) {
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "y*", &key)) return -1;
    if (key.len != 16) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "a Mac takes a 16-byte AES-128 key");
        return -1;
    }
    if (self->ctx == NULL) self->ctx = EVP_CIPHER_CTX_new();
    int ok = self->ctx != NULL
             && EVP_EncryptInit_ex(self->ctx, EVP_aes_128_gcm(), NULL, key.buf, NULL) == 1;
    PyBuffer_Release(&key);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL could not set up AES-128-GCM");
        return -1;
    }
    return 0;
}

static void Mac_dealloc(MacObject *self) {
    if (self->ctx) EVP_CIPHER_CTX_free(self->ctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Mac.tag(datagram) -> the 16-byte tag of a datagram (its own tag field ignored) */
static PyObject *Mac_tag(MacObject *self, PyObject *args) {
    Py_buffer d;
    uint8_t tag[TAG_BYTES];
    if (!PyArg_ParseTuple(args, "y*", &d)) return NULL;
    if (d.len < HEADER_BYTES) {
        PyBuffer_Release(&d);
        PyErr_SetString(PyExc_ValueError, "a datagram is at least a header long");
        return NULL;
    }
    const uint8_t *p = d.buf;
    int rc = gmac(self->ctx, rd16(p + O_SOURCE), rd64(p + SEQ_OFFSET), p, p + HEADER_BYTES,
                  (size_t)d.len - HEADER_BYTES, tag);
    PyBuffer_Release(&d);
    if (rc != 0) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL failed to compute a GMAC");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)tag, TAG_BYTES);
}

/* Mac.check(datagram, size) -> True if its first `size` bytes carry the tag this key makes */
static PyObject *Mac_check(MacObject *self, PyObject *args) {
    Py_buffer d;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "y*n", &d, &size)) return NULL;
    int ok = size >= HEADER_BYTES && size <= d.len && tag_checks(self->ctx, d.buf, (size_t)size);
    PyBuffer_Release(&d);
    return PyBool_FromLong(ok);
}

static PyMethodDef Mac_methods[] = {
    {"tag", (PyCFunction)Mac_tag, METH_VARARGS, "The GMAC tag of a datagram."},
    {"check", (PyCFunction)Mac_check, METH_VARARGS, "Whether a datagram's tag checks."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject MacType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "harness.transport._wire.Mac",
    .tp_basicsize = sizeof(MacObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "AES-128-GMAC of lossbed datagrams under one key (OpenSSL EVP).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Mac_init,
    .tp_dealloc = (destructor)Mac_dealloc,
    .tp_methods = Mac_methods,
};

/* The EVP context of a Mac argument, NULL for None; -1 if it is neither. */
static int mac_arg(PyObject *o, EVP_CIPHER_CTX **ctx) {
    if (o == Py_None) {
        *ctx = NULL;
        return 0;
    }
    if (!PyObject_TypeCheck(o, &MacType)) {
        PyErr_SetString(PyExc_TypeError, "expected a Mac or None");
        return -1;
    }
    *ctx = ((MacObject *)o)->ctx;
    return 0;
}

/* ---- sending ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    int fd;
    uint16_t rank;
    uint64_t nonce;
    Py_ssize_t segment_bytes; /* datagram size the kernel cuts at (UDP_SEGMENT) */
    int segments;             /* datagrams one send may carry: 1 without GSO */
    uint8_t *heads;
    struct iovec *iov;
    struct mmsghdr *msgs;
    Py_ssize_t *msg_first, *msg_count;
    Py_ssize_t capacity; /* packets the scratch holds */
    int busy;
} SenderObject;

static int Sender_init(SenderObject *self, PyObject *args, PyObject *kwds) {
    int fd, rank, segments;
    unsigned long long nonce;
    Py_ssize_t segment_bytes;
    if (!PyArg_ParseTuple(args, "iiKni", &fd, &rank, &nonce, &segment_bytes, &segments))
        return -1;
    if (rank < 0 || rank > 0xFFFF || segments < 1 || segment_bytes < HEADER_BYTES
        || (segments > 1 && (Py_ssize_t)segments * segment_bytes > MAX_UDP_PAYLOAD)) {
        PyErr_SetString(PyExc_ValueError, "Sender(fd, rank, nonce, segment_bytes, segments): "
                        "rank in 0..65535, segment_bytes >= a header, segments >= 1 and "
                        "segments x segment_bytes within one UDP datagram");
        return -1;
    }
    self->fd = fd;
    self->rank = (uint16_t)rank;
    self->nonce = nonce;
    self->segment_bytes = segment_bytes;
    self->segments = segments;
    return 0;
}

static void Sender_dealloc(SenderObject *self) {
    free(self->heads);
    free(self->iov);
    free(self->msgs);
    free(self->msg_first);
    free(self->msg_count);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int sender_reserve(SenderObject *s, Py_ssize_t n) {
    if (n <= s->capacity) return 0;
    Py_ssize_t cap = n < 256 ? 256 : n;
    uint8_t *heads = realloc(s->heads, (size_t)cap * HEADER_BYTES);
    if (heads) s->heads = heads;
    struct iovec *iov = realloc(s->iov, (size_t)cap * 2 * sizeof(struct iovec));
    if (iov) s->iov = iov;
    struct mmsghdr *msgs = realloc(s->msgs, (size_t)cap * sizeof(struct mmsghdr));
    if (msgs) s->msgs = msgs;
    Py_ssize_t *first = realloc(s->msg_first, (size_t)cap * sizeof(Py_ssize_t));
    if (first) s->msg_first = first;
    Py_ssize_t *count = realloc(s->msg_count, (size_t)cap * sizeof(Py_ssize_t));
    if (count) s->msg_count = count;
    if (!heads || !iov || !msgs || !first || !count) {
        PyErr_NoMemory();
        return -1;
    }
    s->capacity = cap;
    return 0;
}

/* Messages from packet `from` on: each holds up to `segments` packets, all but its last
 * exactly one segment long (the kernel cuts at every segment_bytes), none longer. Returns
 * how many messages were laid out from message slot `m`. */
static Py_ssize_t group(SenderObject *s, const struct sockaddr_in *to, Py_ssize_t from,
                        Py_ssize_t total, Py_ssize_t m) {
    Py_ssize_t k = from, start = m;
    while (k < total) {
        Py_ssize_t pk = 1;
        while (pk < s->segments && k + pk < total
               && (Py_ssize_t)(HEADER_BYTES + s->iov[2 * (k + pk - 1) + 1].iov_len)
                      == s->segment_bytes
               && (Py_ssize_t)(HEADER_BYTES + s->iov[2 * (k + pk) + 1].iov_len)
                      <= s->segment_bytes)
            pk++;
        struct msghdr *h = &s->msgs[m].msg_hdr;
        memset(&s->msgs[m], 0, sizeof(struct mmsghdr));
        h->msg_name = (void *)to;
        h->msg_namelen = sizeof(struct sockaddr_in);
        h->msg_iov = &s->iov[2 * k];
        h->msg_iovlen = (size_t)(2 * pk);
        s->msg_first[m] = k;
        s->msg_count[m] = pk;
        m++;
        k += pk;
    }
    return m - start;
}

static int wait_writable(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    return poll(&p, 1, 10);
}

/* Sender.send(sockaddr, dest, mac, seq_first, stage, step, bucket, shard, x, starts, ends,
 *             count, end_stage, copies, first_copy[, fragment_floats, psn_first,
 *             index_first, first_fragment, copy, indexes])
 *   -> (datagrams_sent, ends_sent, payload_bytes_sent, segmented_sends, gso_refused)
 *
 * Packet i carries x's float32 values [starts[i], ends[i]) and says index i of `count`;
 * then `copies` end markers (stage end_stage, index == count, no payload, copy numbers
 * from first_copy). fragment_floats > 0 cuts every packet longer than that into fragments
 * of fragment_floats values (its last one the rest), each its own datagram with its own
 * header (fragment f of F, the fragment's length): the messages of RoCE UC semantics. With
 * a mac, datagram k gets seq seq_first + k and its tag: the caller reserves one seq per
 * datagram (fragments and end markers included). psn_first >= 0 (RC): data datagram k
 * carries psn psn_first + k, which the caller has reserved in its send flow.
 * Sending again (RC's go-back-N): packet i says index index_first + i, the first packet
 * starts at its fragment first_fragment, and every data datagram carries copy `copy`.
 * indexes (int64, one per packet, or None): packet i says index indexes[i] instead, for
 * packets of a shard that are not consecutive (an owner broadcasting the packets it has
 * rebuilt so far: harness/collectives/pipeline.py). */
static PyObject *Sender_send(SenderObject *self, PyObject *args) {
    Py_buffer addr, x, starts, ends;
    PyObject *mac_obj;
    int dest, stage, bucket, shard, end_stage, copies, first_copy;
    unsigned long long seq_first;
    unsigned int step, count;
    Py_ssize_t fragment_floats = 0, index_first = 0, first_fragment = 0;
    long long psn_first = -1;
    int data_copy = 0;
    PyObject *indexes_obj = Py_None;
    Py_buffer indexes = {0};
    EVP_CIPHER_CTX *mac;
    if (!PyArg_ParseTuple(args, "y*iOKiIiiy*y*y*Iiii|nLnniO", &addr, &dest, &mac_obj,
                          &seq_first, &stage, &step, &bucket, &shard, &x, &starts, &ends,
                          &count, &end_stage, &copies, &first_copy, &fragment_floats,
                          &psn_first, &index_first, &first_fragment, &data_copy,
                          &indexes_obj))
        return NULL;
    PyObject *result = NULL;
    const char *bad = NULL;
    const int64_t *idx = NULL;
    if (indexes_obj != Py_None) {
        if (PyObject_GetBuffer(indexes_obj, &indexes, PyBUF_SIMPLE) < 0) goto done;
        idx = indexes.buf;
        if (indexes.len != starts.len) {
            bad = "indexes: an int64 array, one index per packet";
        } else {
            for (Py_ssize_t i = 0; i < indexes.len / 8; i++)
                if (idx[i] < 0 || idx[i] > 0xFFFFFFFFLL) {
                    bad = "indexes: the packets' indexes must fit 32 bits";
                    break;
                }
        }
        if (bad) {
            PyErr_SetString(PyExc_ValueError, bad);
            goto done;
        }
    }
    if (mac_arg(mac_obj, &mac) < 0) goto done;
    if (addr.len != sizeof(struct sockaddr_in)) bad = "sockaddr must be a 16-byte sockaddr_in";
    else if (starts.len != ends.len || starts.len % 8) bad = "starts and ends: int64 arrays of one length";
    else if (copies < 0 || first_copy < 0 || first_copy + copies > 0xFFFF) bad = "copies out of range";
    else if (dest < 0 || dest > 0xFFFF || stage < 0 || stage > 255 || end_stage < 0
             || end_stage > 255 || bucket < 0 || bucket > 0xFFFF || shard < 0 || shard > 0xFFFF)
        bad = "a header field is out of its range";
    else if (fragment_floats < 0) bad = "fragment_floats: 0 (never cut) or the values a fragment holds";
    else if (index_first < 0 || index_first + starts.len / 8 > 0xFFFFFFFFLL)
        bad = "index_first: the packets' indexes must fit 32 bits";
    else if (data_copy < 0 || data_copy > 0xFFFF) bad = "copy out of range";
    else if (self->busy) bad = "this Sender is already sending (one thread at a time)";
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad);
        goto done;
    }
    Py_ssize_t n = starts.len / 8;
    const int64_t *st = starts.buf, *en = ends.buf;
    Py_ssize_t floats = x.len / 4, n_data = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t len = en[i] - st[i];
        int64_t cut = fragment_floats > 0 && len > fragment_floats ? fragment_floats : len;
        int64_t pieces = cut > 0 ? (len + cut - 1) / cut : 1;
        if (st[i] < 0 || en[i] < st[i] || en[i] > floats || pieces > 0xFFFF
            || HEADER_BYTES + 4 * cut > MAX_UDP_PAYLOAD) {
            PyErr_Format(PyExc_ValueError, "packet %zd: [%lld, %lld) is not a packet of x "
                         "(%zd floats) that fits in at most 65535 datagrams", i,
                         (long long)st[i], (long long)en[i], floats);
            goto done;
        }
        if (i == 0 && first_fragment != 0 && (first_fragment < 0 || first_fragment >= pieces)) {
            PyErr_Format(PyExc_ValueError, "first_fragment %zd: packet 0 has %lld fragments",
                         first_fragment, (long long)pieces);
            goto done;
        }
        n_data += (Py_ssize_t)pieces - (i == 0 ? first_fragment : 0);
    }
    if (n == 0 && first_fragment != 0) {
        PyErr_SetString(PyExc_ValueError, "first_fragment: there is no packet to start in");
        goto done;
    }
    Py_ssize_t total = n_data + copies;
    if (psn_first > 0xFFFFFFFFLL - n_data) {
        PyErr_SetString(PyExc_ValueError, "psn_first: the psns of this send pass 2**32");
        goto done;
    }
    if (sender_reserve(self, total) < 0) goto done;

    const uint8_t *xb = x.buf;
    Py_ssize_t packet = 0, fragment = first_fragment;
    int starting = 1; /* at the first datagram of a packet: work out its cut */
    int64_t len_p = 0, cut = 0, pieces = 1; /* of the packet being cut */
    long long bytes = 0;
    for (Py_ssize_t k = 0; k < total; k++) {
        uint8_t *h = self->heads + k * HEADER_BYTES;
        int data = k < n_data;
        int64_t first = 0, len_f = 0;
        if (!data) {
            pieces = 1;
        } else {
            if (starting) {
                len_p = en[packet] - st[packet];
                cut = fragment_floats > 0 && len_p > fragment_floats ? fragment_floats : len_p;
                pieces = cut > 0 ? (len_p + cut - 1) / cut : 1;
                starting = 0;
            }
            first = st[packet] + fragment * cut;
            len_f = fragment == pieces - 1 ? len_p - fragment * cut : cut;
        }
        size_t len = (size_t)(4 * len_f);
        bytes += (long long)len;
        memset(h, 0, HEADER_BYTES);
        wr32(h + O_MAGIC, MAGIC);
        h[O_VERSION] = VERSION;
        h[O_STAGE] = (uint8_t)(data ? stage : end_stage);
        wr16(h + O_SOURCE, self->rank);
        wr64(h + O_NONCE, self->nonce);
        wr32(h + O_STEP, step);
        wr16(h + O_BUCKET, (uint16_t)bucket);
        wr16(h + O_SHARD, (uint16_t)shard);
        wr16(h + O_FRAGMENT, (uint16_t)(data ? fragment : 0));
        wr16(h + O_FRAGMENTS, (uint16_t)pieces);
        wr32(h + O_INDEX, !data ? count
                          : (uint32_t)(idx ? idx[packet] : index_first + packet));
        wr32(h + O_COUNT, count);
        wr32(h + O_LENGTH, (uint32_t)len);
        if (data && psn_first >= 0) wr32(h + O_PSN, (uint32_t)(psn_first + k));
        wr16(h + O_COPY, (uint16_t)(data ? data_copy : first_copy + (k - n_data)));
        wr16(h + O_DEST, (uint16_t)dest);
        self->iov[2 * k].iov_base = h;
        self->iov[2 * k].iov_len = HEADER_BYTES;
        self->iov[2 * k + 1].iov_base = data ? (void *)(xb + 4 * first) : (void *)h;
        self->iov[2 * k + 1].iov_len = len;
        if (mac) {
            wr64(h + SEQ_OFFSET, seq_first + (uint64_t)k);
            if (gmac(mac, self->rank, seq_first + (uint64_t)k, h, self->iov[2 * k + 1].iov_base,
                     len, h + TAG_OFFSET) != 0) {
                PyErr_SetString(PyExc_RuntimeError, "OpenSSL failed to compute a GMAC");
                goto done;
            }
        }
        if (data && ++fragment == pieces) {
            fragment = 0;
            packet++;
            starting = 1;
        }
    }
    const struct sockaddr_in *to = addr.buf;
    Py_ssize_t m = group(self, to, 0, total, 0);
    Py_ssize_t done_msgs = 0, failed_data = 0, failed_ends = 0, segmented = 0;
    int refused = 0;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    while (done_msgs < m) {
        Py_ssize_t batch = m - done_msgs < MAX_SENDMMSG ? m - done_msgs : MAX_SENDMMSG;
        int r = sendmmsg(self->fd, self->msgs + done_msgs, (unsigned int)batch, 0);
        if (r > 0) {
            for (Py_ssize_t j = done_msgs; j < done_msgs + r; j++)
                segmented += self->msg_count[j] > 1;
            done_msgs += r;
            continue;
        }
        int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS) {
            wait_writable(self->fd); /* the send buffer is full: wait for room */
        } else if (err == EINTR) {
            continue;
        } else if ((err == EIO || err == EINVAL) && self->msg_count[done_msgs] > 1) {
            /* the route cannot segment: this and everything after, one datagram a send,
             * with the socket's segmentation off too (so that no send is cut) */
            int off = 0;
            refused = 1;
            self->segments = 1;
            setsockopt(self->fd, IPPROTO_UDP, UDP_SEGMENT, &off, sizeof(off));
            Py_ssize_t from = self->msg_first[done_msgs];
            m = done_msgs + group(self, to, from, total, done_msgs);
        } else {
            /* this message cannot go (e.g. no route): skip it, like a drop */
            for (Py_ssize_t k = self->msg_first[done_msgs];
                 k < self->msg_first[done_msgs] + self->msg_count[done_msgs]; k++) {
                if (k < n_data) {
                    failed_data++;
                    bytes -= (long long)self->iov[2 * k + 1].iov_len;
                } else {
                    failed_ends++;
                }
            }
            done_msgs++;
        }
    }
    Py_END_ALLOW_THREADS
    self->busy = 0;
    result = Py_BuildValue("nnLni", n_data - failed_data, (Py_ssize_t)copies - failed_ends, bytes,
                           segmented, refused);
done:
    PyBuffer_Release(&addr);
    PyBuffer_Release(&x);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    if (indexes.obj) PyBuffer_Release(&indexes);
    return result;
}

/* Sender.plan(payload_lengths) -> [datagrams in each send]: how send() would group
 * packets whose payloads have these lengths (int64) into sends (for the tests). */
static PyObject *Sender_plan(SenderObject *self, PyObject *args) {
    Py_buffer lengths;
    if (!PyArg_ParseTuple(args, "y*", &lengths)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = lengths.len / 8;
    const int64_t *len = lengths.buf;
    if (lengths.len % 8) {
        PyErr_SetString(PyExc_ValueError, "payload lengths: an int64 array");
        goto done;
    }
    if (sender_reserve(self, n) < 0) goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (len[k] < 0 || len[k] > MAX_UDP_PAYLOAD) {
            PyErr_SetString(PyExc_ValueError, "a payload length is out of range");
            goto done;
        }
        self->iov[2 * k + 1].iov_len = (size_t)len[k];
    }
    struct sockaddr_in nowhere = {0};
    Py_ssize_t m = group(self, &nowhere, 0, n, 0);
    result = PyList_New(m);
    for (Py_ssize_t j = 0; result && j < m; j++)
        PyList_SET_ITEM(result, j, PyLong_FromSsize_t(self->msg_count[j]));
done:
    PyBuffer_Release(&lengths);
    return result;
}

static PyObject *Sender_get_segments(SenderObject *self, void *closure) {
    return PyLong_FromLong(self->segments);
}

static PyMethodDef Sender_methods[] = {
    {"send", (PyCFunction)Sender_send, METH_VARARGS,
     "Build, seal and send one shard's packets and its end markers."},
    {"plan", (PyCFunction)Sender_plan, METH_VARARGS,
     "How packets of these payload lengths would be grouped into sends."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Sender_getset[] = {
    {"segments", (getter)Sender_get_segments, NULL, "datagrams one send may carry", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject SenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "harness.transport._wire.Sender",
    .tp_basicsize = sizeof(SenderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sends batches of lossbed packets from one socket.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Sender_init,
    .tp_dealloc = (destructor)Sender_dealloc,
    .tp_methods = Sender_methods,
    .tp_getset = Sender_getset,
};

/* ---- receiving ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    int fd;
    Py_ssize_t rows, slot_bytes;
    Py_buffer data, sizes, addrs, ports; /* held for the receiver's life */
    int held;
    struct mmsghdr *msgs;
    struct iovec *iov;
    struct sockaddr_in *names;
} ReceiverObject;

static void Receiver_release(ReceiverObject *self) {
    if (self->held) {
        PyBuffer_Release(&self->data);
        PyBuffer_Release(&self->sizes);
        PyBuffer_Release(&self->addrs);
        PyBuffer_Release(&self->ports);
        self->held = 0;
    }
}

/* Receiver(fd, data, slot_bytes, sizes, addrs, ports): datagram i of a batch lands in
 * data[i * slot_bytes:], its size in sizes[i] (int64; -1 if it was longer than a slot), its
 * sender's IPv4 address and port (host order) in addrs[i] (uint32) and ports[i] (uint16). */
static int Receiver_init(ReceiverObject *self, PyObject *args, PyObject *kwds) {
    int fd;
    Py_ssize_t slot;
    Receiver_release(self);
    if (!PyArg_ParseTuple(args, "iw*nw*w*w*", &fd, &self->data, &slot, &self->sizes,
                          &self->addrs, &self->ports))
        return -1;
    self->held = 1;
    Py_ssize_t rows = slot > 0 ? self->data.len / slot : 0;
    if (slot < HEADER_BYTES || rows < 1 || self->sizes.len < rows * 8
        || self->addrs.len < rows * 4 || self->ports.len < rows * 2) {
        Receiver_release(self);
        PyErr_SetString(PyExc_ValueError, "Receiver: data holds rows of slot_bytes, sizes "
                        "(int64), addrs (uint32) and ports (uint16) one entry per row");
        return -1;
    }
    self->fd = fd;
    self->rows = rows;
    self->slot_bytes = slot;
    free(self->msgs);
    free(self->iov);
    free(self->names);
    self->msgs = calloc((size_t)rows, sizeof(struct mmsghdr));
    self->iov = calloc((size_t)rows, sizeof(struct iovec));
    self->names = calloc((size_t)rows, sizeof(struct sockaddr_in));
    if (!self->msgs || !self->iov || !self->names) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < rows; i++) {
        self->iov[i].iov_base = (uint8_t *)self->data.buf + i * slot;
        self->iov[i].iov_len = (size_t)slot;
    }
    return 0;
}

static void Receiver_dealloc(ReceiverObject *self) {
    Receiver_release(self);
    free(self->msgs);
    free(self->iov);
    free(self->names);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Receiver.receive() -> how many datagrams arrived (0: none queued) */
static PyObject *Receiver_receive(ReceiverObject *self, PyObject *unused) {
    for (Py_ssize_t i = 0; i < self->rows; i++) {
        struct msghdr *h = &self->msgs[i].msg_hdr;
        memset(h, 0, sizeof(*h));
        h->msg_name = &self->names[i];
        h->msg_namelen = sizeof(struct sockaddr_in);
        h->msg_iov = &self->iov[i];
        h->msg_iovlen = 1;
    }
    int r;
    Py_BEGIN_ALLOW_THREADS
    do {
        r = recvmmsg(self->fd, self->msgs, (unsigned int)self->rows, MSG_DONTWAIT, NULL);
    } while (r < 0 && errno == EINTR);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return PyLong_FromLong(0);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    int64_t *sizes = self->sizes.buf;
    uint32_t *addrs = self->addrs.buf;
    uint16_t *ports = self->ports.buf;
    for (int i = 0; i < r; i++) {
        int truncated = (self->msgs[i].msg_hdr.msg_flags & MSG_TRUNC) != 0;
        sizes[i] = truncated ? -1 : (int64_t)self->msgs[i].msg_len;
        addrs[i] = ntohl(self->names[i].sin_addr.s_addr);
        ports[i] = ntohs(self->names[i].sin_port);
    }
    return PyLong_FromLong(r);
}

static PyMethodDef Receiver_methods[] = {
    {"receive", (PyCFunction)Receiver_receive, METH_NOARGS, "recvmmsg one batch."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ReceiverType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "harness.transport._wire.Receiver",
    .tp_basicsize = sizeof(ReceiverObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Receives batches of datagrams into rows of one buffer.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Receiver_init,
    .tp_dealloc = (destructor)Receiver_dealloc,
    .tp_methods = Receiver_methods,
};

/* screen(data, slot_bytes, sizes, addrs, ports, n, rank, world, nonce, macs, peer_addrs,
 *        peer_ports, classes) -> (foreign, unauthenticated, misdirected, truncated)
 *
 * What each of the first n rows is (classes[i], int8): not this job's (magic, version,
 * nonce, a source outside the job or this rank itself, or a sender address that is not the
 * source's endpoint), not sealed with its source's key (macs: one Mac per source, or None
 * for a job without a key), addressed to another rank, cut short by the receive buffer, a
 * data packet or fragment of one (stage reduce or broadcast, a fragment number below the
 * fragment count, a length that fits the datagram: apply() checks the rest against the
 * layout), or anything else for the caller's slow path (end markers, control, bad
 * lengths). */
static PyObject *screen(PyObject *mod, PyObject *args) {
    Py_buffer data, sizes_b, addrs_b, ports_b, paddrs_b, pports_b, cls_b;
    Py_ssize_t slot, n;
    int rank, world;
    unsigned long long nonce;
    PyObject *macs;
    if (!PyArg_ParseTuple(args, "y*ny*y*y*niiKOy*y*w*", &data, &slot, &sizes_b, &addrs_b,
                          &ports_b, &n, &rank, &world, &nonce, &macs, &paddrs_b, &pports_b,
                          &cls_b))
        return NULL;
    PyObject *result = NULL;
    EVP_CIPHER_CTX **ctx = NULL;
    if (slot < HEADER_BYTES || n < 0 || world < 1 || rank < 0 || rank >= world
        || data.len < n * slot || sizes_b.len < n * 8 || addrs_b.len < n * 4
        || ports_b.len < n * 2 || cls_b.len < n || paddrs_b.len < world * 4
        || pports_b.len < world * 2) {
        PyErr_SetString(PyExc_ValueError, "screen: buffers too small for n rows / world peers");
        goto done;
    }
    if (macs != Py_None) {
        if (!PySequence_Check(macs) || PySequence_Size(macs) != world) {
            PyErr_SetString(PyExc_ValueError, "macs: one Mac (or None) per rank, or None");
            goto done;
        }
        ctx = calloc((size_t)world, sizeof(*ctx));
        if (!ctx) { PyErr_NoMemory(); goto done; }
        for (int r = 0; r < world; r++) {
            PyObject *m = PySequence_GetItem(macs, r);
            if (!m) goto done;
            int bad = mac_arg(m, &ctx[r]);
            Py_DECREF(m);
            if (bad < 0) goto done;
        }
    }
    const int64_t *sizes = sizes_b.buf;
    const uint32_t *addrs = addrs_b.buf, *paddrs = paddrs_b.buf;
    const uint16_t *ports = ports_b.buf, *pports = pports_b.buf;
    int8_t *cls = cls_b.buf;
    Py_ssize_t foreign = 0, unauth = 0, misdirected = 0, truncated = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *p = (const uint8_t *)data.buf + i * slot;
        int64_t size = sizes[i];
        if (size < 0) { /* longer than a slot: its tag cannot be checked */
            cls[i] = CLS_TRUNCATED;
            truncated++;
            continue;
        }
        if (size > slot) size = slot;
        uint16_t source = size >= HEADER_BYTES ? rd16(p + O_SOURCE) : 0;
        if (size < HEADER_BYTES || rd32(p + O_MAGIC) != MAGIC || p[O_VERSION] != VERSION
            || rd64(p + O_NONCE) != nonce || source >= world || source == rank
            || paddrs[source] != addrs[i] || pports[source] != ports[i]) {
            cls[i] = CLS_FOREIGN;
            foreign++;
            continue;
        }
        if (ctx && (!ctx[source] || !tag_checks(ctx[source], p, (size_t)size))) {
            cls[i] = CLS_UNAUTHENTICATED;
            unauth++;
            continue;
        }
        if (rd16(p + O_DEST) != rank) { /* genuine, but another rank's */
            cls[i] = CLS_MISDIRECTED;
            misdirected++;
            continue;
        }
        uint32_t length = rd32(p + O_LENGTH);
        int plain = (int64_t)length == size - HEADER_BYTES && length % 4 == 0
                    && p[O_STAGE] <= STAGE_BROADCAST
                    && rd16(p + O_FRAGMENT) < rd16(p + O_FRAGMENTS);
        cls[i] = plain ? CLS_DATA : CLS_OTHER;
    }
    result = Py_BuildValue("nnnn", foreign, unauth, misdirected, truncated);
done:
    free(ctx);
    PyBuffer_Release(&data);
    PyBuffer_Release(&sizes_b);
    PyBuffer_Release(&addrs_b);
    PyBuffer_Release(&ports_b);
    PyBuffer_Release(&paddrs_b);
    PyBuffer_Release(&pports_b);
    PyBuffer_Release(&cls_b);
    return result;
}

/* ---- RC: taking datagrams in order ----------------------------------------------------- */

/* Go-back-N's receiver (gobackn.ReceiveFlow.accept, its reference), for the screened data
 * datagrams data[rows[i]] in the order they came: a source's next psn is delivered (its
 * expected psn moves on, the row goes to `delivered`, in order), an earlier psn is a
 * duplicate (counted per source), a later one comes after a gap and is dropped (per source,
 * the highest such psn). What to answer (ACK, NAK) is the caller's. A source past the
 * flows (`expected` has one entry per source) is taken by none of them. Returns how many
 * rows were delivered. */
static PyObject *in_order(PyObject *mod, PyObject *args) {
    Py_buffer data, rows_b, exp_b, out_b, dup_b, gap_b;
    Py_ssize_t slot;
    if (!PyArg_ParseTuple(args, "y*ny*w*w*w*w*", &data, &slot, &rows_b, &exp_b, &out_b,
                          &dup_b, &gap_b))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t nrows = rows_b.len / 8, world = exp_b.len / 8;
    Py_ssize_t slots = slot >= HEADER_BYTES ? data.len / slot : 0;
    const int64_t *rows = rows_b.buf;
    int64_t *expected = exp_b.buf, *delivered = out_b.buf, *duplicates = dup_b.buf,
            *gap_max = gap_b.buf;
    if (slot < HEADER_BYTES || out_b.len < nrows * 8 || dup_b.len != world * 8
        || gap_b.len != world * 8) {
        PyErr_SetString(PyExc_ValueError, "in_order: a slot shorter than a header, fewer "
                        "outputs than rows, or per-source arrays of different lengths");
        goto done;
    }
    for (Py_ssize_t i = 0; i < nrows; i++) {
        if (rows[i] < 0 || rows[i] >= slots) {
            PyErr_SetString(PyExc_ValueError, "in_order: a row outside the buffer");
            goto done;
        }
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < nrows; i++) {
        const uint8_t *p = (const uint8_t *)data.buf + rows[i] * slot;
        uint16_t source = rd16(p + O_SOURCE);
        int64_t psn = rd32(p + O_PSN);
        if (source >= world) continue;
        if (psn == expected[source]) {
            expected[source]++;
            delivered[k++] = rows[i];
        } else if (psn < expected[source]) {
            duplicates[source]++;
        } else if (psn > gap_max[source]) {
            gap_max[source] = psn;
        }
    }
    result = PyLong_FromSsize_t(k);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&rows_b);
    PyBuffer_Release(&exp_b);
    PyBuffer_Release(&out_b);
    PyBuffer_Release(&dup_b);
    PyBuffer_Release(&gap_b);
    return result;
}

/* ---- applying ----------------------------------------------------------------------- */

/* Whether none of the values is a NaN or an infinity (all exponent bits set). No early
 * exit: the loop then compiles to vector compares (-fvect-cost-model=cheap, pyproject.toml),
 * and a packet is one pass over a few kilobytes that are in the cache already. */
static inline int all_finite(const uint8_t *restrict p, Py_ssize_t floats) {
    uint32_t bad = 0;
    for (Py_ssize_t j = 0; j < floats; j++) {
        uint32_t bits;
        memcpy(&bits, p + 4 * j, 4);
        bad |= (bits & 0x7F800000u) == 0x7F800000u;
    }
    return !bad;
}

/* target[j] += the j-th float of the payload. restrict: a payload (the receive buffer)
 * never overlaps the target, so the sum compiles to vector adds without a runtime overlap
 * check. */
static inline void add_floats(float *restrict target, const uint8_t *restrict payload,
                              int64_t floats) {
    for (int64_t j = 0; j < floats; j++) {
        float v;
        memcpy(&v, payload + 4 * j, 4);
        target[j] += v;
    }
}

/* The staging area of apply(): where the fragments of RoCE UC messages wait until their
 * message is whole. Sized by the receiver's own layout only (per_packet floats for every
 * message it expects, a flag per fragment a message can have, a count per message), never
 * by what a datagram says; which fragments came is made anew by the caller for every step
 * (purged at the step boundary). Each source has its own region: reduce messages of all
 * sources land on the same place of the target (they are summed there). */
typedef struct {
    int64_t fragment_floats; /* values a fragment holds (all but a message's last) */
    int64_t most;            /* fragments a message of per_packet values is cut into */
    float *staging;          /* message i of source s at staging_base[s] + i * per_packet */
    const int64_t *staging_base;
    uint8_t *frag_got;       /* (world x got_stride) x most: which fragments came */
    int32_t *frag_count;     /* world x got_stride: how many came; -1 once it was whole */
} Staging;

/* What one fragment did to its message: HELD (kept, not whole yet), DUPLICATE, or the
 * message whole (WHOLE: its values are in staging, checked by the caller like a packet). */
enum { FRAG_HELD, FRAG_DUPLICATE, FRAG_WHOLE };

static int stage_fragment(const Staging *sg, int64_t slot, int64_t at, int fragment,
                          int64_t fragments, const uint8_t *payload, uint32_t length) {
    uint8_t *flag = &sg->frag_got[slot * sg->most + fragment];
    if (*flag || sg->frag_count[slot] < 0) return FRAG_DUPLICATE;
    memcpy(sg->staging + at + (int64_t)fragment * sg->fragment_floats, payload, length);
    *flag = 1;
    if (++sg->frag_count[slot] < fragments) return FRAG_HELD;
    sg->frag_count[slot] = -1; /* whole: any later fragment of it is a duplicate */
    return FRAG_WHOLE;
}

/* apply(data, slot_bytes, rows, step, bucket, stage, owner, expected, last_floats, base,
 *       per_packet, target, got, got_stride, pending, ended, add, accept, leftover
 *       [, fragment_floats, staging, staging_base, frag_got, frag_count])
 *   -> (applied, duplicates, malformed, nonfinite, stale, leftovers, held)
 *
 * The data packets of one stage of one step, from the given rows of `data` (screened:
 * addressed here, a length that fits the datagram). Per source s (int64 arrays of world
 * entries): expected[s] packets, the last holding last_floats[s] values and the others
 * per_packet, packet i landing at target[base[s] + i * per_packet] (float32). owner: the
 * shard every packet must name (-1: its source's). got (uint8, world x got_stride) says
 * which have come; pending counts down. ended (uint8 per source, or None): set for a source
 * whose packet fits (its broadcast tells that its reduce packets all went out). add: sum
 * into target, else copy. accept: 0 once the stage was rebuilt (packets then count stale).
 * Rows of this stage for another step or bucket are written to `leftover` (int64) for the
 * caller; rows of the other stage are skipped.
 *
 * fragment_floats (0 or >= per_packet: packets are never cut): a packet of more values is a
 * message cut into fragments of that many (RoCE UC). Each fragment is checked against the
 * receiver's layout (its message's fragment count, its own length), copied into `staging`
 * (float32; message i of source s at staging_base[s] + i * per_packet, int64 per source),
 * and counted held; the fragment that makes a message whole makes it a packet, checked and
 * applied from staging as any other (frag_got: uint8, world x got_stride x the most
 * fragments a message has; frag_count: int32, world x got_stride; both zero at the step's
 * start). A message missing a fragment is never applied, nor are parts of it: partially
 * placed data stays in staging. */
static PyObject *apply(PyObject *mod, PyObject *args) {
    Py_buffer data, rows_b, exp_b, last_b, base_b, target_b, got_b, pend_b, left_b, ended_b;
    Py_buffer stg_b, sbase_b, fgot_b, fcount_b;
    Py_ssize_t slot, per_packet, stride, fragment_floats = 0;
    unsigned int step;
    int bucket, stage, owner, add, accept;
    PyObject *ended_obj, *staging_obj = Py_None, *sbase_obj = Py_None, *fgot_obj = Py_None,
             *fcount_obj = Py_None;
    if (!PyArg_ParseTuple(args, "y*ny*Iiiiy*y*y*nw*w*nw*Oppw*|nOOOO", &data, &slot, &rows_b,
                          &step, &bucket, &stage, &owner, &exp_b, &last_b, &base_b,
                          &per_packet, &target_b, &got_b, &stride, &pend_b, &ended_obj, &add,
                          &accept, &left_b, &fragment_floats, &staging_obj, &sbase_obj,
                          &fgot_obj, &fcount_obj))
        return NULL;
    PyObject *result = NULL;
    int have_ended = 0, have_staging = 0;
    const char *bad = NULL;
    Py_ssize_t world = exp_b.len / 8, nrows = rows_b.len / 8, target_len = target_b.len / 4;
    Staging sg = {0};
    if (ended_obj != Py_None) {
        if (PyObject_GetBuffer(ended_obj, &ended_b, PyBUF_WRITABLE) < 0) goto done;
        have_ended = 1;
        if (ended_b.len < world) bad = "ended: one entry per source";
    }
    if (!bad && fragment_floats > 0 && fragment_floats < per_packet) {
        if (PyObject_GetBuffer(staging_obj, &stg_b, PyBUF_WRITABLE) < 0) goto done;
        if (PyObject_GetBuffer(sbase_obj, &sbase_b, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&stg_b);
            goto done;
        }
        if (PyObject_GetBuffer(fgot_obj, &fgot_b, PyBUF_WRITABLE) < 0) {
            PyBuffer_Release(&stg_b);
            PyBuffer_Release(&sbase_b);
            goto done;
        }
        if (PyObject_GetBuffer(fcount_obj, &fcount_b, PyBUF_WRITABLE) < 0) {
            PyBuffer_Release(&stg_b);
            PyBuffer_Release(&sbase_b);
            PyBuffer_Release(&fgot_b);
            goto done;
        }
        have_staging = 1;
        sg.fragment_floats = fragment_floats;
        sg.most = (per_packet + fragment_floats - 1) / fragment_floats;
        sg.staging = stg_b.buf;
        sg.staging_base = sbase_b.buf;
        sg.frag_got = fgot_b.buf;
        sg.frag_count = fcount_b.buf;
        if (sbase_b.len != world * 8 || fgot_b.len < world * stride * sg.most
            || fcount_b.len < world * stride * 4)
            bad = "staging_base, frag_got or frag_count does not fit the layout";
        /* every message the layout expects must fit its source's staging region */
        for (Py_ssize_t s = 0; !bad && s < world; s++) {
            const int64_t *exp = exp_b.buf;
            if (exp_b.len == world * 8 && exp[s] > 0
                && (sg.staging_base[s] < 0
                    || sg.staging_base[s] + exp[s] * per_packet > stg_b.len / 4))
                bad = "the layout does not fit the staging area";
        }
    }
    const int64_t *expected = exp_b.buf, *last = last_b.buf, *base = base_b.buf;
    if (!bad && (slot < HEADER_BYTES || per_packet < 1 || stride < 1 || world < 1
                 || exp_b.len % 8 || last_b.len != exp_b.len || base_b.len != exp_b.len
                 || pend_b.len != exp_b.len || rows_b.len % 8 || left_b.len < rows_b.len
                 || got_b.len < world * stride || owner < -1 || owner >= world))
        bad = "apply: arrays of the wrong size";
    /* the receiver's own layout must fit its own buffers: then no packet that fits the
     * layout can index outside them */
    for (Py_ssize_t s = 0; !bad && s < world; s++) {
        if (expected[s] < 0 || expected[s] > stride) bad = "expected > got_stride";
        else if (expected[s] > 0
                 && (last[s] < 0 || last[s] > per_packet || base[s] < 0
                     || base[s] + (expected[s] - 1) * per_packet + last[s] > target_len))
            bad = "the layout does not fit the target";
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad);
        goto done;
    }
    const int64_t *rows = rows_b.buf;
    const uint8_t *db = data.buf;
    float *target = target_b.buf;
    uint8_t *got = got_b.buf, *ended = have_ended ? ended_b.buf : NULL;
    int64_t *pending = pend_b.buf, *leftover = left_b.buf;
    Py_ssize_t applied = 0, dup = 0, malformed = 0, nonfinite = 0, stale = 0, nleft = 0;
    Py_ssize_t held = 0, claims = 0;
    for (Py_ssize_t r = 0; r < nrows; r++) {
        int64_t row = rows[r];
        if (row < 0 || (row + 1) * slot > data.len) {
            PyErr_Format(PyExc_IndexError, "row %lld is not in data", (long long)row);
            goto done;
        }
        const uint8_t *p = db + row * slot;
        if (p[O_STAGE] != stage) continue;
        if (rd32(p + O_STEP) != step || rd16(p + O_BUCKET) != bucket) {
            leftover[nleft++] = row;
            continue;
        }
        uint16_t src = rd16(p + O_SOURCE);
        uint32_t index = rd32(p + O_INDEX), length = rd32(p + O_LENGTH);
        uint16_t fragment = rd16(p + O_FRAGMENT), fragments = rd16(p + O_FRAGMENTS);
        if (src >= world) {
            malformed++;
            continue;
        }
        int64_t exp = expected[src];
        int64_t floats = (int64_t)index == exp - 1 ? last[src] : per_packet;
        int64_t own = owner >= 0 ? owner : src;
        /* the datagrams this packet is cut into, by the receiver's own layout */
        int64_t pieces = have_staging && floats > fragment_floats
                             ? (floats + fragment_floats - 1) / fragment_floats : 1;
        int64_t carried = pieces == 1 ? floats
                          : fragment == pieces - 1 ? floats - fragment * fragment_floats
                          : fragment_floats;
        if (rd16(p + O_SHARD) != own || (int64_t)rd32(p + O_COUNT) != exp
            || (int64_t)index >= exp || fragments != pieces || fragment >= pieces
            || (int64_t)length != 4 * carried || HEADER_BYTES + (Py_ssize_t)length > slot) {
            malformed++;
            continue;
        }
        if (ended) ended[src] = 1;
        uint8_t *seen = &got[src * stride + index];
        const uint8_t *payload = p + HEADER_BYTES;
        if (pieces > 1) {
            if (*seen) {
                dup++;
                continue;
            }
            int64_t staged = sg.staging_base[src] + (int64_t)index * per_packet;
            int what = stage_fragment(&sg, src * stride + index, staged, fragment, pieces,
                                      payload, length);
            if (what == FRAG_DUPLICATE) dup++;
            if (what == FRAG_HELD) held++;
            if (what != FRAG_WHOLE) continue;
            payload = (const uint8_t *)(sg.staging + staged); /* the whole message */
        }
        if (!all_finite(payload, floats)) {
            nonfinite++;
            continue;
        }
        if (*seen) {
            dup++;
            continue;
        }
        if (!accept) {
            /* too late to be used: not applied and not marked received; but claimed for
             * this call, so that a second copy in this batch is a duplicate (as the
             * reference counts it). The claims are undone below; their rows are kept at
             * the far end of `leftover`, which the leftovers fill from the front. (A whole
             * message needs no claim: its fragments are marked in staging.) */
            if (pieces == 1) {
                *seen = 2;
                leftover[nrows - 1 - claims++] = (int64_t)(src * stride + index);
            }
            stale++;
            continue;
        }
        float *t = target + base[src] + (int64_t)index * per_packet;
        if (add) {
            add_floats(t, payload, floats);
        } else {
            memcpy(t, payload, (size_t)(4 * floats));
        }
        *seen = 1;
        pending[src]--;
        applied++;
    }
    for (Py_ssize_t k = 0; k < claims; k++) got[leftover[nrows - 1 - k]] = 0;
    result = Py_BuildValue("nnnnnnn", applied, dup, malformed, nonfinite, stale, nleft, held);
done:
    if (have_ended) PyBuffer_Release(&ended_b);
    if (have_staging) {
        PyBuffer_Release(&stg_b);
        PyBuffer_Release(&sbase_b);
        PyBuffer_Release(&fgot_b);
        PyBuffer_Release(&fcount_b);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&rows_b);
    PyBuffer_Release(&exp_b);
    PyBuffer_Release(&last_b);
    PyBuffer_Release(&base_b);
    PyBuffer_Release(&target_b);
    PyBuffer_Release(&got_b);
    PyBuffer_Release(&pend_b);
    PyBuffer_Release(&left_b);
    return result;
}

static PyMethodDef module_methods[] = {
    {"screen", screen, METH_VARARGS, "Classify a received batch (see the C source)."},
    {"apply", apply, METH_VARARGS, "Apply one stage's data packets of a batch."},
    {"in_order", in_order, METH_VARARGS, "RC: a batch's data datagrams taken in order."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef wire_module = {
    PyModuleDef_HEAD_INIT, "_wire",
    "The compiled per-datagram work of lossbed's data plane (see native.py).", -1,
    module_methods};

PyMODINIT_FUNC PyInit__wire(void) {
    if (PyType_Ready(&MacType) < 0 || PyType_Ready(&SenderType) < 0
        || PyType_Ready(&ReceiverType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&wire_module);
    if (!m) return NULL;
    Py_INCREF(&MacType);
    Py_INCREF(&SenderType);
    Py_INCREF(&ReceiverType);
    if (PyModule_AddObject(m, "Mac", (PyObject *)&MacType) < 0
        || PyModule_AddObject(m, "Sender", (PyObject *)&SenderType) < 0
        || PyModule_AddObject(m, "Receiver", (PyObject *)&ReceiverType) < 0
        || PyModule_AddIntConstant(m, "HEADER_BYTES", HEADER_BYTES) < 0
        || PyModule_AddIntConstant(m, "SEQ_OFFSET", SEQ_OFFSET) < 0
        || PyModule_AddIntConstant(m, "TAG_OFFSET", TAG_OFFSET) < 0
        || PyModule_AddIntConstant(m, "MAGIC", (long)MAGIC) < 0
        || PyModule_AddIntConstant(m, "VERSION", VERSION) < 0
        || PyModule_AddIntConstant(m, "DEST_OFFSET", O_DEST) < 0
        || PyModule_AddIntConstant(m, "CLS_FOREIGN", CLS_FOREIGN) < 0
        || PyModule_AddIntConstant(m, "CLS_UNAUTHENTICATED", CLS_UNAUTHENTICATED) < 0
        || PyModule_AddIntConstant(m, "CLS_MISDIRECTED", CLS_MISDIRECTED) < 0
        || PyModule_AddIntConstant(m, "CLS_TRUNCATED", CLS_TRUNCATED) < 0
        || PyModule_AddIntConstant(m, "CLS_DATA", CLS_DATA) < 0
        || PyModule_AddIntConstant(m, "CLS_OTHER", CLS_OTHER) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
