/*
 * pdb_str.c - joining short strings into a fixed buffer (see the header).
 */
#include "pdb/pdb_str.h"

#include <string.h>

static size_t put(char *dst, size_t at, size_t room, const char *s, size_t n)
{
    if (at < room)
        memcpy(dst + at, s, n < room - at ? n : room - at);
    return at + n;
}

size_t pdb_str_join(char *dst, size_t size, const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), room = size - 1;
    size_t end = put(dst, put(dst, 0, room, a, la), room, b, lb);
    dst[end < room ? end : room] = '\0';
    return end;
}
