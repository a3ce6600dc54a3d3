/* What every compiled module of lossbed's data plane shares: the datagram header's layout
 * (harness/transport/header.py is its definition; native.py checks the constants at import),
 * big-endian field access, and the GMAC that seals a datagram and checks its tag.
 *
 * Included by _wire.c (the data plane) and harness/bench/_blaster.c (the wire's own limit),
 * each its own extension module: everything here is static, one copy per module. */
#ifndef LOSSBED_WIRE_H
#define LOSSBED_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#define HEADER_BYTES 72
#define SEQ_OFFSET 48
#define TAG_OFFSET 56
#define TAG_BYTES 16
#define MAGIC 0x4C424544u
#define VERSION 5
#define STAGE_REDUCE 0
#define STAGE_BROADCAST 1
#define MAX_UDP_PAYLOAD 65507
#define MAX_SENDMMSG 1024
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103 /* linux/udp.h */
#endif

/* header field offsets (header.py) */
enum { O_MAGIC = 0, O_VERSION = 4, O_STAGE = 5, O_SOURCE = 6, O_NONCE = 8, O_STEP = 16,
       O_BUCKET = 20, O_SHARD = 22, O_FRAGMENT = 24, O_FRAGMENTS = 26, O_INDEX = 28,
       O_COUNT = 32, O_LENGTH = 36, O_PSN = 40, O_COPY = 44, O_DEST = 46 };

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t rd32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t rd64(const uint8_t *p) {
    return ((uint64_t)rd32(p) << 32) | rd32(p + 4);
}
static inline void wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void wr32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}
static inline void wr64(uint8_t *p, uint64_t v) { wr32(p, (uint32_t)(v >> 32)); wr32(p + 4, (uint32_t)v); }

/* ---- the MAC ------------------------------------------------------------------------ */

/* GMAC of head (HEADER_BYTES, its tag field taken as zero) followed by payload. 0 on
 * success. */
static int gmac(EVP_CIPHER_CTX *ctx, uint32_t source, uint64_t seq, const uint8_t *head,
                const uint8_t *payload, size_t payload_len, uint8_t tag[TAG_BYTES]) {
    static const uint8_t zeros[TAG_BYTES];
    uint8_t iv[12], none[16];
    int outl;
    wr32(iv, source);
    wr64(iv + 4, seq);
    if (EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, iv) != 1) return -1;
    if (EVP_EncryptUpdate(ctx, NULL, &outl, head, TAG_OFFSET) != 1) return -1;
    if (EVP_EncryptUpdate(ctx, NULL, &outl, zeros, TAG_BYTES) != 1) return -1;
    if (payload_len > 0 && payload_len <= INT32_MAX
        && EVP_EncryptUpdate(ctx, NULL, &outl, payload, (int)payload_len) != 1) return -1;
    if (EVP_EncryptFinal_ex(ctx, none, &outl) != 1) return -1;
    if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG_BYTES, tag) != 1) return -1;
    return 0;
}

/* 1: the datagram's tag is the one `ctx` makes for it (source and seq from its header). */
static int tag_checks(EVP_CIPHER_CTX *ctx, const uint8_t *datagram, size_t size) {
    uint8_t tag[TAG_BYTES];
    if (size < HEADER_BYTES) return 0;
    if (gmac(ctx, rd16(datagram + O_SOURCE), rd64(datagram + SEQ_OFFSET), datagram,
             datagram + HEADER_BYTES, size - HEADER_BYTES, tag) != 0) return 0;
    return CRYPTO_memcmp(tag, datagram + TAG_OFFSET, TAG_BYTES) == 0;
}

#endif /* LOSSBED_WIRE_H */
