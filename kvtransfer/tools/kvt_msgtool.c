/*
 * kvt-msgtool -- encode / decode libkvt control messages from the command
 * line (wire tests, debugging a capture).
 *
 *   kvt-msgtool encode [--raw]   JSON object on stdin -> msgpack on stdout (hex
 *                                text, or raw bytes with --raw)
 *   kvt-msgtool decode [--raw]   msgpack (hex text, or raw with --raw) on stdin
 *                                -> JSON of the decoded message (defaults
 *                                applied) on stdout
 * Exit 0 on success; 1 with {"error": "<KVT_STATUS>", "field": ..., "reason":
 * ...} on stdout when the input is refused; 2 on usage / I/O errors.
 */
#include <kvt/kvt_msg.h>
#include <pdb/pdb_hex.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INPUT (64u << 20)

static int read_all(FILE *f, unsigned char **out, size_t *len_out)
{
    size_t cap = 4096, len = 0;
    unsigned char *buf = malloc(cap);

    if (buf == NULL)
        return -1;
    for (;;) {
        size_t r;
        if (len == cap) {
            unsigned char *nb;
            if (cap >= MAX_INPUT) {
                free(buf);
                return -1;
            }
            cap *= 2;
            nb = realloc(buf, cap);
            if (nb == NULL) {
                free(buf);
                return -1;
            }
            buf = nb;
        }
        r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len_out = len;
    return 0;
}

/* Decode hex text in place, skipping whitespace. */
static int unhex(unsigned char *buf, size_t len, size_t *out_len)
{
    size_t o = 0;
    int hi = -1;

    for (size_t i = 0; i < len; i++) {
        int v;
        if (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t')
            continue;
        v = pdb_hex_val((char)buf[i]);
        if (v < 0)
            return -1;
        if (hi < 0) {
            hi = v;
        } else {
            buf[o++] = (unsigned char)(hi << 4 | v);
            hi = -1;
        }
    }
    if (hi >= 0)
        return -1;
    *out_len = o;
    return 0;
}

static void print_error(kvt_status_t st, const kvt_msg_err_t *err)
{
    printf("{\"error\": \"%s\", \"field\": \"%s\", \"reason\": \"%s\", \"offset\": %zu}\n",
           kvt_status_name(st), err->field ? err->field : "", err->reason ? err->reason : "",
           err->offset);
}

static int usage(void)
{
    fprintf(stderr, "usage: kvt-msgtool encode|decode [--raw] < input\n");
    return 2;
}

int main(int argc, char **argv)
{
    unsigned char *in = NULL;
    size_t len = 0;
    int raw = 0, rc = 0;
    kvt_msg_err_t err = {0};
    kvt_msg_t m;
    kvt_status_t st;

    if (argc < 2 || argc > 3)
        return usage();
    if (argc == 3) {
        if (strcmp(argv[2], "--raw") != 0)
            return usage();
        raw = 1;
    }
    if (read_all(stdin, &in, &len) != 0) {
        fprintf(stderr, "kvt-msgtool: cannot read stdin\n");
        return 2;
    }

    if (strcmp(argv[1], "encode") == 0) {
        void *data = NULL;
        size_t dlen = 0;
        st = kvt_msg_from_json((const char *)in, len, &m, &err);
        if (st == KVT_OK) {
            st = kvt_msg_encode(&m, &data, &dlen);
            kvt_msg_clear(&m);
        }
        if (st != KVT_OK) {
            print_error(st, &err);
            rc = 1;
        } else if (raw) {
            fwrite(data, 1, dlen, stdout);
        } else {
            for (size_t i = 0; i < dlen; i++)
                printf("%02x", ((unsigned char *)data)[i]);
            printf("\n");
        }
        kvt_free(data);
    } else if (strcmp(argv[1], "decode") == 0) {
        if (!raw && unhex(in, len, &len) != 0) {
            fprintf(stderr, "kvt-msgtool: input is not hex\n");
            free(in);
            return 2;
        }
        st = kvt_msg_decode(in, len, &m, &err);
        if (st != KVT_OK) {
            print_error(st, &err);
            rc = 1;
        } else {
            char *js = kvt_msg_to_json(&m);
            if (js == NULL) {
                rc = 2;
            } else {
                printf("%s\n", js);
                kvt_free(js);
            }
            kvt_msg_clear(&m);
        }
    } else {
        rc = usage();
    }
    free(in);
    return rc;
}
