/*
 * pdgw_auth.c - API key set and constant-time Bearer check.
 *
 * Every key is stored in a fixed PDGW_AUTH_KEY_MAX-byte slot (zero padded) with its length.
 * The presented token is copied into a slot of the same size, then compared with every
 * configured slot over the whole slot length; the lengths are folded into the same
 * accumulator. Work per check = n_keys * PDGW_AUTH_KEY_MAX byte operations whatever the
 * token, so timing reveals neither a matching prefix nor which key matched.
 */
#include "pdgw_auth.h"

#include <ctype.h>
#include <pthread.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pdgw_alloc.h"
#include "pdgw_log.h"

typedef struct key_slot {
    unsigned char bytes[PDGW_AUTH_KEY_MAX];
    size_t len;
} key_slot_t;

typedef struct key_set {
    key_slot_t *slots;
    size_t n;
    size_t cap;
} key_set_t;

/* The sets are replaced as a whole by pdgw_auth_swap (config reload); checks hold the read
 * side of <lock> for the few microseconds of a comparison. */
struct pdgw_auth {
    pthread_rwlock_t lock;
    key_set_t api;
    key_set_t admin;
};

int pdgw_ct_memeq(const void *a, const void *b, size_t len)
{
    const volatile unsigned char *x = a, *y = b;
    unsigned char acc = 0;
    for (size_t i = 0; i < len; i++)
        acc |= (unsigned char)(x[i] ^ y[i]);
    return acc == 0;
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pdgw_log_error("auth", "%s", msg);
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "%s", msg);
}

/* Key charset: printable ASCII without blanks (keys travel in an HTTP header). */
static bool key_chars_ok(const char *k, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)k[i];
        if (c <= 0x20 || c >= 0x7f)
            return false;
    }
    return true;
}

static pdgw_status_t add_key(key_set_t *a, const char *k, size_t len, const char *where, char *err,
                             size_t errlen)
{
    if (len == 0) {
        set_err(err, errlen, "%s: empty API key", where);
        return PDGW_ERR_INVALID;
    }
    if (len > PDGW_AUTH_KEY_MAX) {
        set_err(err, errlen, "%s: API key longer than %d bytes", where, PDGW_AUTH_KEY_MAX);
        return PDGW_ERR_INVALID;
    }
    if (!key_chars_ok(k, len)) {
        set_err(err, errlen, "%s: API key contains blanks or non-printable characters", where);
        return PDGW_ERR_INVALID;
    }
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4;
        key_slot_t *s = pdgw_realloc(a->slots, cap * sizeof(*s));
        if (s == NULL) {
            set_err(err, errlen, "out of memory");
            return PDGW_ERR_NOMEM;
        }
        a->slots = s;
        a->cap = cap;
    }
    key_slot_t *slot = &a->slots[a->n++];
    memset(slot->bytes, 0, sizeof(slot->bytes));
    memcpy(slot->bytes, k, len);
    slot->len = len;
    return PDGW_OK;
}

pdgw_status_t pdgw_key_file_each(const char *path, pdgw_key_line_fn fn, void *arg, char *err,
                                 size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        set_err(err, errlen, "api_key_file %s: %s", path, strerror(errno));
        return PDGW_ERR_IO;
    }
    pdgw_status_t st = PDGW_OK;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    unsigned lineno = 0;
    while (st == PDGW_OK && (n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        char *s = line, *t;
        size_t len = (size_t)n, klen, tlen;
        while (len > 0 && isspace((unsigned char)s[len - 1]))
            len--;
        while (len > 0 && isspace((unsigned char)*s)) {
            s++;
            len--;
        }
        if (len == 0 || *s == '#')
            continue;
        char where[300];
        snprintf(where, sizeof(where), "api_key_file %s:%u", path, lineno);
        /* "KEY" or "KEY TENANT": a key has no blanks, so the first blank ends it */
        for (klen = 0; klen < len && s[klen] != ' ' && s[klen] != '\t'; klen++)
            ;
        t = s + klen;
        tlen = len - klen;
        while (tlen > 0 && (*t == ' ' || *t == '\t')) {
            t++;
            tlen--;
        }
        if (memchr(t, ' ', tlen) != NULL || memchr(t, '\t', tlen) != NULL) {
            set_err(err, errlen, "%s: expected KEY or KEY TENANT, got more fields", where);
            st = PDGW_ERR_INVALID;
            break;
        }
        st = fn(arg, s, klen, tlen ? t : NULL, tlen, where, err, errlen);
    }
    if (st == PDGW_OK && ferror(f)) {
        set_err(err, errlen, "api_key_file %s: read error", path);
        st = PDGW_ERR_IO;
    }
    if (line != NULL) {
        memset(line, 0, cap);
        free(line);
    }
    fclose(f);
    return st;
}

static pdgw_status_t file_key(void *arg, const char *key, size_t key_len, const char *tenant,
                              size_t tenant_len, const char *where, char *err, size_t errlen)
{
    (void)tenant; /* the tenant a key belongs to is the quota layer's (pdgw_tenants.c) */
    (void)tenant_len;
    return add_key(arg, key, key_len, where, err, errlen);
}

static pdgw_status_t load_file(key_set_t *a, const char *path, char *err, size_t errlen)
{
    return pdgw_key_file_each(path, file_key, a, err, errlen);
}

pdgw_status_t pdgw_auth_create(const char *const *keys, size_t n_keys, const char *key_file,
                               char *err, size_t errlen, pdgw_auth_t **out)
{
    pdgw_auth_t *a = pdgw_calloc(1, sizeof(*a));
    if (a == NULL) {
        set_err(err, errlen, "out of memory");
        return PDGW_ERR_NOMEM;
    }
    pthread_rwlock_init(&a->lock, NULL);
    pdgw_status_t st = PDGW_OK;
    for (size_t i = 0; i < n_keys && st == PDGW_OK; i++) {
        char where[64];
        snprintf(where, sizeof(where), "api_keys[%zu]", i);
        st = add_key(&a->api, keys[i] != NULL ? keys[i] : "", keys[i] != NULL ? strlen(keys[i]) : 0,
                     where, err, errlen);
    }
    if (st == PDGW_OK && key_file != NULL && key_file[0] != '\0') {
        st = load_file(&a->api, key_file, err, errlen);
        if (st == PDGW_OK && a->api.n == n_keys)
            pdgw_log_warn("auth", "api_key_file %s holds no key", key_file);
    }
    if (st != PDGW_OK) {
        pdgw_auth_destroy(a);
        return st;
    }
    *out = a;
    return PDGW_OK;
}

static void key_set_clear(key_set_t *s)
{
    if (s->slots != NULL) {
        /* Do not leave keys in freed memory. */
        volatile unsigned char *p = (volatile unsigned char *)s->slots;
        for (size_t i = 0; i < s->cap * sizeof(key_slot_t); i++)
            p[i] = 0;
    }
    pdgw_free(s->slots);
    memset(s, 0, sizeof(*s));
}

void pdgw_auth_destroy(pdgw_auth_t *auth)
{
    if (auth == NULL)
        return;
    key_set_clear(&auth->api);
    key_set_clear(&auth->admin);
    pthread_rwlock_destroy(&auth->lock);
    pdgw_free(auth);
}

pdgw_status_t pdgw_auth_set_admin_key(pdgw_auth_t *auth, const char *key, char *err, size_t errlen)
{
    pdgw_status_t st = PDGW_OK;
    pthread_rwlock_wrlock(&auth->lock);
    key_set_clear(&auth->admin);
    if (key != NULL && key[0] != '\0')
        st = add_key(&auth->admin, key, strlen(key), "admin_api_key", err, errlen);
    pthread_rwlock_unlock(&auth->lock);
    return st;
}

void pdgw_auth_swap(pdgw_auth_t *live, pdgw_auth_t *fresh)
{
    key_set_t api, admin;
    pthread_rwlock_wrlock(&fresh->lock);
    api = fresh->api;
    admin = fresh->admin;
    pthread_rwlock_wrlock(&live->lock);
    fresh->api = live->api;
    fresh->admin = live->admin;
    live->api = api;
    live->admin = admin;
    pthread_rwlock_unlock(&live->lock);
    pthread_rwlock_unlock(&fresh->lock);
}

size_t pdgw_auth_key_count(const pdgw_auth_t *auth)
{
    size_t n;
    if (auth == NULL)
        return 0;
    pthread_rwlock_rdlock(&((pdgw_auth_t *)auth)->lock);
    n = auth->api.n;
    pthread_rwlock_unlock(&((pdgw_auth_t *)auth)->lock);
    return n;
}

bool pdgw_auth_has_admin_key(const pdgw_auth_t *auth)
{
    bool has;
    if (auth == NULL)
        return false;
    pthread_rwlock_rdlock(&((pdgw_auth_t *)auth)->lock);
    has = auth->admin.n > 0;
    pthread_rwlock_unlock(&((pdgw_auth_t *)auth)->lock);
    return has;
}

/* The token of a "Bearer <token>" header in [*tok, *tok + *len), or the refusal. */
static pdgw_auth_result_t bearer_token(const char *header, const char **tok, size_t *len_out)
{
    if (header == NULL)
        return PDGW_AUTH_MISSING;
    const char *p = header;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '\0')
        return PDGW_AUTH_MISSING;
    if (strncasecmp(p, "Bearer", 6) != 0 || (p[6] != ' ' && p[6] != '\t'))
        return PDGW_AUTH_BAD_SCHEME;
    p += 6;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t len = strlen(p);
    while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
        len--;
    if (len == 0)
        return PDGW_AUTH_BAD_SCHEME;
    *tok = p;
    *len_out = len;
    return PDGW_AUTH_OK;
}

/* Constant-time match of the token against every key of <set> (see the file comment). */
static bool set_match(const key_set_t *set, const char *p, size_t len)
{
    /*
     * Too-long tokens still go through the full comparison (with a length that can never
     * match), so the time spent does not tell "too long" from "wrong".
     */
    unsigned char tok[PDGW_AUTH_KEY_MAX];
    memset(tok, 0, sizeof(tok));
    memcpy(tok, p, len < sizeof(tok) ? len : sizeof(tok));
    volatile unsigned char found = 0;
    for (size_t k = 0; k < set->n; k++) {
        const key_slot_t *s = &set->slots[k];
        unsigned char diff = 0;
        for (size_t i = 0; i < PDGW_AUTH_KEY_MAX; i++)
            diff |= (unsigned char)(tok[i] ^ s->bytes[i]);
        size_t ld = len ^ s->len;
        for (size_t b = 0; b < sizeof(ld); b++)
            diff |= (unsigned char)(ld >> (8 * b));
        /* found |= (diff == 0) without a branch */
        found |= (unsigned char)(1 & ((((unsigned)diff) - 1) >> 8));
    }
    volatile unsigned char *t = tok;
    for (size_t i = 0; i < sizeof(tok); i++)
        t[i] = 0;
    return found != 0;
}

static pdgw_auth_result_t check_sets(const pdgw_auth_t *auth, const char *header, bool api,
                                     bool admin)
{
    pdgw_auth_t *a = (pdgw_auth_t *)auth;
    pdgw_auth_result_t r;
    const char *tok = NULL;
    size_t len = 0;
    bool any, found = false;

    pthread_rwlock_rdlock(&a->lock);
    any = (api && a->api.n > 0) || (admin && a->admin.n > 0);
    if (!any) {
        r = PDGW_AUTH_DISABLED;
        goto out;
    }
    r = bearer_token(header, &tok, &len);
    if (r != PDGW_AUTH_OK)
        goto out;
    /* Both sets are always compared when both are asked for: no early exit. */
    if (api)
        found |= set_match(&a->api, tok, len);
    if (admin)
        found |= set_match(&a->admin, tok, len);
    r = found ? PDGW_AUTH_OK : PDGW_AUTH_INVALID;
out:
    pthread_rwlock_unlock(&a->lock);
    return r;
}

pdgw_auth_result_t pdgw_auth_check(const pdgw_auth_t *auth, const char *header)
{
    if (auth == NULL)
        return PDGW_AUTH_DISABLED;
    return check_sets(auth, header, true, false);
}

pdgw_auth_result_t pdgw_auth_check_admin(const pdgw_auth_t *auth, const char *header, bool write,
                                         bool peer_loopback)
{
    bool has_admin = pdgw_auth_has_admin_key(auth);
    if (!has_admin) {
        /* No admin credential: writes only from this host, reads as any other route. */
        if (write && !peer_loopback)
            return PDGW_AUTH_FORBIDDEN;
        return auth == NULL ? PDGW_AUTH_DISABLED : check_sets(auth, header, true, false);
    }
    /* Writes need the admin key; reads take it or an API key. A missing header is
     * "missing" even when API keys are off, so a read is not silently open. */
    if (!write) {
        pdgw_auth_result_t r = check_sets(auth, header, true, true);
        return r == PDGW_AUTH_DISABLED ? PDGW_AUTH_MISSING : r;
    }
    return check_sets(auth, header, false, true);
}

const char *pdgw_auth_result_name(pdgw_auth_result_t r)
{
    switch (r) {
    case PDGW_AUTH_OK:
        return "ok";
    case PDGW_AUTH_DISABLED:
        return "disabled";
    case PDGW_AUTH_MISSING:
        return "missing";
    case PDGW_AUTH_BAD_SCHEME:
        return "bad_scheme";
    case PDGW_AUTH_INVALID:
        return "invalid";
    case PDGW_AUTH_FORBIDDEN:
        return "forbidden";
    }
    return "unknown";
}

void pdgw_auth_result_to_error(pdgw_auth_result_t r, pdgw_api_error_t *err)
{
    switch (r) {
    case PDGW_AUTH_MISSING:
        pdgw_api_error_set(err, PDGW_API_ERR_UNAUTHORIZED, NULL,
                           "Missing API key: send \"Authorization: Bearer <key>\".");
        pdgw_api_error_set_code(err, "missing_api_key");
        break;
    case PDGW_AUTH_BAD_SCHEME:
        pdgw_api_error_set(err, PDGW_API_ERR_UNAUTHORIZED, NULL,
                           "Malformed Authorization header: expected \"Bearer <key>\".");
        pdgw_api_error_set_code(err, "invalid_api_key");
        break;
    default:
        pdgw_api_error_set(err, PDGW_API_ERR_UNAUTHORIZED, NULL, "Incorrect API key provided.");
        pdgw_api_error_set_code(err, "invalid_api_key");
        break;
    }
}
