/*
 * pdgw_auth.h - API keys and the "Authorization: Bearer <key>" check.
 *
 * Keys come from the config list and/or a key file (one key per line, optionally followed by
 * the name of the tenant it belongs to; blank lines and lines starting with '#' ignored;
 * surrounding blanks trimmed). The check compares the presented
 * token against EVERY configured key, each over the same fixed length, without early exit,
 * so its duration depends neither on which key matched nor on how many leading bytes of a
 * key were right; the only input-dependent cost is reading the header itself.
 * A separate admin key (admin_api_key) guards /admin/...: see pdgw_auth_check_admin.
 *
 * Every function is safe from any thread. A config reload builds a fresh object and moves
 * its key sets into the live one with pdgw_auth_swap (checks hold a read lock for the length
 * of one comparison), so the pointer the server holds never changes.
 */
#ifndef PDGW_AUTH_H
#define PDGW_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "pdgw_errors.h"

/* Longest accepted key (bytes). Longer keys in config/file are a config error. */
#define PDGW_AUTH_KEY_MAX 256

typedef struct pdgw_auth pdgw_auth_t;

typedef enum pdgw_auth_result {
    PDGW_AUTH_OK = 0,          /* a configured key matched */
    PDGW_AUTH_DISABLED = 1,    /* no keys configured: everything allowed */
    PDGW_AUTH_MISSING = -1,    /* no Authorization header */
    PDGW_AUTH_BAD_SCHEME = -2, /* header present but not "Bearer <token>" */
    PDGW_AUTH_INVALID = -3,    /* Bearer token did not match any key */
    PDGW_AUTH_FORBIDDEN = -4,  /* admin write from a non-loopback peer without admin_api_key */
} pdgw_auth_result_t;

/*
 * Build the key set from <keys> (n_keys entries, copied) and <key_file> (NULL or "" = none).
 * Empty keys are refused (PDGW_ERR_INVALID), as are keys with blanks/control characters or
 * longer than PDGW_AUTH_KEY_MAX; an unreadable file is PDGW_ERR_IO. The reason is logged
 * and, when <err> is non-NULL, written there (errlen bytes).
 */
pdgw_status_t pdgw_auth_create(const char *const *keys, size_t n_keys, const char *key_file,
                               char *err, size_t errlen, pdgw_auth_t **out);
void pdgw_auth_destroy(pdgw_auth_t *auth);

/* Number of API keys; 0 means authentication is off. NULL auth counts as 0. */
size_t pdgw_auth_key_count(const pdgw_auth_t *auth);

/* Replace the admin key (NULL or "" = none); same checks as API keys. */
pdgw_status_t pdgw_auth_set_admin_key(pdgw_auth_t *auth, const char *key, char *err, size_t errlen);
/* Is an admin key configured? */
bool pdgw_auth_has_admin_key(const pdgw_auth_t *auth);

/*
 * Move the key sets of <fresh> into <live> at once; <fresh> gets the old sets (destroy it
 * afterwards). Checks running on other threads see either the old or the new sets.
 */
void pdgw_auth_swap(pdgw_auth_t *live, pdgw_auth_t *fresh);

/*
 * Check the value of the Authorization header (<header> NULL = header absent). The scheme
 * "Bearer" is matched case-insensitively, followed by one or more blanks, then the token
 * (trailing blanks ignored). NULL <auth> or no keys gives PDGW_AUTH_DISABLED.
 */
pdgw_auth_result_t pdgw_auth_check(const pdgw_auth_t *auth, const char *header);

/*
 * The /admin/... rule. With an admin key: a <write> (any method but GET/HEAD) needs
 * "Bearer <admin key>"; a read takes the admin key or an API key, and is never open.
 * Without one: a write from a peer that is not loopback (<peer_loopback> false) is
 * PDGW_AUTH_FORBIDDEN; otherwise the API keys decide as for any route.
 */
pdgw_auth_result_t pdgw_auth_check_admin(const pdgw_auth_t *auth, const char *header, bool write,
                                         bool peer_loopback);

/* True for PDGW_AUTH_OK and PDGW_AUTH_DISABLED. */
static inline bool pdgw_auth_allowed(pdgw_auth_result_t r)
{
    return r == PDGW_AUTH_OK || r == PDGW_AUTH_DISABLED;
}
/* "ok", "disabled", "missing", "bad_scheme", "invalid", "forbidden". */
const char *pdgw_auth_result_name(pdgw_auth_result_t r);

/*
 * Fill <err> with the 401 reply for a refused result (message says what was wrong, code
 * "invalid_api_key" or "missing_api_key"). The caller also sends
 * "WWW-Authenticate: Bearer".
 */
void pdgw_auth_result_to_error(pdgw_auth_result_t r, pdgw_api_error_t *err);

/* One line of a key file: the key, the tenant named after it (NULL when none), and
 * "api_key_file PATH:LINE" for messages. Non-OK stops the reading. */
typedef pdgw_status_t (*pdgw_key_line_fn)(void *arg, const char *key, size_t key_len,
                                          const char *tenant, size_t tenant_len, const char *where,
                                          char *err, size_t errlen);
/* Read a key file ("KEY" or "KEY TENANT" per line, '#' comments), calling <fn> per key. */
pdgw_status_t pdgw_key_file_each(const char *path, pdgw_key_line_fn fn, void *arg, char *err,
                                 size_t errlen);

/* Constant-time equality of two equal-length byte strings (non-zero when equal). */
int pdgw_ct_memeq(const void *a, const void *b, size_t len);

#endif /* PDGW_AUTH_H */
