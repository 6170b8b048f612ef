/*
 * kvt_uuid.c -- random v4 UUIDs and their canonical 8-4-4-4-12 text form.
 */
#include "kvt/kvt_uuid.h"
#include "pdb/pdb_hex.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

static kvt_status_t fill_random(uint8_t *buf, size_t len)
{
    size_t got = 0;
    int fd;

    while (got < len) {
        ssize_t r = getrandom(buf + got, len - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        got += (size_t)r;
    }
    if (got == len)
        return KVT_OK;

    fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return KVT_ERR_IO;
    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            close(fd);
            return KVT_ERR_IO;
        }
        got += (size_t)r;
    }
    close(fd);
    return KVT_OK;
}

kvt_status_t kvt_uuid_generate(kvt_uuid_t *out)
{
    kvt_uuid_t u;
    kvt_status_t status;

    if (out == NULL)
        return KVT_ERR_INVALID;
    status = fill_random(u.b, sizeof(u.b));
    if (status != KVT_OK)
        return status;
    u.b[6] = (uint8_t)((u.b[6] & 0x0f) | 0x40); /* version 4 */
    u.b[8] = (uint8_t)((u.b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    *out = u;
    return KVT_OK;
}

char *kvt_uuid_to_str(const kvt_uuid_t *u, char *out)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[o++] = '-';
        out[o++] = hex[u->b[i] >> 4];
        out[o++] = hex[u->b[i] & 0xf];
    }
    out[o] = '\0';
    return out;
}

kvt_status_t kvt_uuid_parse(const char *s, size_t len, kvt_uuid_t *out)
{
    kvt_uuid_t u;
    size_t i = 0;

    if (s == NULL || out == NULL || len != KVT_UUID_STR_LEN)
        return KVT_ERR_INVALID;
    for (int b = 0; b < 16; b++) {
        int hi, lo;
        if (b == 4 || b == 6 || b == 8 || b == 10) {
            if (s[i] != '-')
                return KVT_ERR_INVALID;
            i++;
        }
        hi = pdb_hex_val(s[i]);
        lo = pdb_hex_val(s[i + 1]);
        if (hi < 0 || lo < 0)
            return KVT_ERR_INVALID;
        u.b[b] = (uint8_t)(hi << 4 | lo);
        i += 2;
    }
    *out = u;
    return KVT_OK;
}

int kvt_uuid_equal(const kvt_uuid_t *a, const kvt_uuid_t *b)
{
    return memcmp(a->b, b->b, sizeof(a->b)) == 0;
}

int kvt_uuid_is_nil(const kvt_uuid_t *u)
{
    for (int i = 0; i < 16; i++)
        if (u->b[i] != 0)
            return 0;
    return 1;
}
