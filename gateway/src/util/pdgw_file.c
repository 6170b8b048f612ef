/*
 * pdgw_file.c - reading small files whole (TLS material, keys). Declared in pdgw_util.h.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

char *pdgw_file_read_all(const char *path, size_t max, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (f == NULL)
        return NULL;
    for (;;) {
        size_t n;
        if (cap - len < 4096) {
            char *nb;
            cap = cap ? cap * 2 : 8192;
            nb = realloc(buf, cap + 1);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = nb;
        }
        n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (len > max) {
            free(buf);
            fclose(f);
            errno = EFBIG;
            return NULL;
        }
        if (n == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        fclose(f);
        errno = EIO;
        return NULL;
    }
    fclose(f);
    buf[len] = '\0';
    *len_out = len;
    return buf;
}
