/*
 * pdgw_json_raw.c - a JSON value carried as its text through a jansson tree (see the header).
 */
#include "pdgw_json_raw.h"

#include <pthread.h>
#include <string.h>

#include "pdgw_alloc.h"
#include "pdgw_util.h"

#define MARK_RANDOM 16                                              /* bytes: 128 bits */
#define MARK_LEN    (sizeof(MARK_PREFIX) - 1 + 2 * MARK_RANDOM + 1) /* prefix, hex, '\x01' */
#define MARK_PREFIX "\x01pdgw-raw-json:"

static char mark[MARK_LEN + 1];
static pthread_once_t mark_once = PTHREAD_ONCE_INIT;
static bool mark_ok;

static void mark_init(void)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char r[MARK_RANDOM];
    size_t n = sizeof(MARK_PREFIX) - 1;

    if (pdgw_random_bytes(r, sizeof(r)) != PDGW_OK)
        return; /* no raw values: callers fall back to what they did before */
    memcpy(mark, MARK_PREFIX, n);
    for (size_t i = 0; i < sizeof(r); i++) {
        mark[n++] = hex[r[i] >> 4];
        mark[n++] = hex[r[i] & 15];
    }
    mark[n++] = '\x01';
    mark[n] = '\0';
    mark_ok = true;
}

json_t *pdgw_json_raw(const char *text, size_t len)
{
    json_t *v;
    char *buf;

    pthread_once(&mark_once, mark_init);
    if (!mark_ok || len > SIZE_MAX - MARK_LEN || (buf = pdgw_malloc(MARK_LEN + len)) == NULL)
        return NULL;
    memcpy(buf, mark, MARK_LEN);
    memcpy(buf + MARK_LEN, text, len);
    v = json_stringn_nocheck(buf, MARK_LEN + len);
    pdgw_free(buf);
    return v;
}

bool pdgw_json_raw_text(const json_t *v, const char **text, size_t *len)
{
    const char *s;
    size_t n;

    if (!json_is_string(v))
        return false;
    pthread_once(&mark_once, mark_init);
    s = json_string_value(v);
    n = json_string_length(v);
    if (!mark_ok || n <= MARK_LEN || memcmp(s, mark, MARK_LEN) != 0)
        return false;
    *text = s + MARK_LEN;
    *len = n - MARK_LEN;
    return true;
}
