/*
 * pdgw_errors.h - the gateway's status enum and the OpenAI-style error replies.
 *
 * Two kinds of error live here:
 *  - pdgw_status_t: what a function of the gateway returns (0 OK, >0 in progress, <0 error);
 *  - pdgw_api_error_t: what a client sees, {"error":{"message","type","param","code"}} with
 *    the HTTP status that goes with it, as a JSON body or as one SSE event.
 */
#ifndef PDGW_ERRORS_H
#define PDGW_ERRORS_H

#include <stddef.h>

#include <jansson.h>

typedef enum pdgw_status {
    PDGW_INPROGRESS = 1,
    PDGW_OK = 0,
    PDGW_ERR_NOMEM = -1,        /* allocation failed */
    PDGW_ERR_INVALID = -2,      /* invalid argument or value */
    PDGW_ERR_PARSE = -3,        /* malformed text (YAML, JSON, header) */
    PDGW_ERR_NOT_FOUND = -4,    /* no such key, file, series, instance */
    PDGW_ERR_EXISTS = -5,       /* duplicate name */
    PDGW_ERR_IO = -6,           /* read/write/open failed (see errno in the log) */
    PDGW_ERR_LIMIT = -7,        /* a bound was hit (cardinality cap, buffer size) */
    PDGW_ERR_TOO_LARGE = -8,    /* body or value larger than allowed */
    PDGW_ERR_UNSUPPORTED = -9,  /* feature or mode not supported */
    PDGW_ERR_TIMEOUT = -10,     /* a deadline passed */
    PDGW_ERR_CONNECT = -11,     /* could not connect upstream */
    PDGW_ERR_UPSTREAM = -12,    /* upstream answered with an error or garbage */
    PDGW_ERR_CANCELLED = -13,   /* cancelled (client gone, shutdown) */
    PDGW_ERR_BUSY = -14,        /* overloaded, try later */
    PDGW_ERR_NO_INSTANCE = -15, /* no usable instance for a role */
    PDGW_ERR_AUTH = -16,        /* authentication failed */
    PDGW_ERR_ABI = -17,         /* plugin ABI mismatch */
    PDGW_ERR_STATE = -18,       /* call not valid in the current state */
    PDGW_ERR_SYSTEM = -19,      /* a system call failed (see errno in the log) */
    PDGW_ERR_CLOSED = -20,      /* peer or stream closed */
} pdgw_status_t;

/* Short constant text for <status>; never NULL (unknown values give "unknown status"). */
const char *pdgw_strerror(pdgw_status_t status);

/*
 * Client-facing error kinds. Each has one HTTP status and one OpenAI "type":
 *   BAD_REQUEST        400 invalid_request_error
 *   UNAUTHORIZED       401 authentication_error
 *   NOT_FOUND          404 not_found_error
 *   METHOD_NOT_ALLOWED 405 invalid_request_error
 *   TOO_LARGE          413 invalid_request_error
 *   RATE_LIMITED       429 rate_limit_error
 *   INTERNAL           500 server_error
 *   BAD_GATEWAY        502 upstream_error
 *   UNAVAILABLE        503 service_unavailable_error
 *   TIMEOUT            504 timeout_error
 *   URI_TOO_LONG       414 invalid_request_error
 */
typedef enum pdgw_api_err_kind {
    PDGW_API_ERR_BAD_REQUEST = 0,
    PDGW_API_ERR_UNAUTHORIZED,
    PDGW_API_ERR_NOT_FOUND,
    PDGW_API_ERR_METHOD_NOT_ALLOWED,
    PDGW_API_ERR_TOO_LARGE,
    PDGW_API_ERR_RATE_LIMITED,
    PDGW_API_ERR_INTERNAL,
    PDGW_API_ERR_BAD_GATEWAY,
    PDGW_API_ERR_UNAVAILABLE,
    PDGW_API_ERR_TIMEOUT,
    PDGW_API_ERR_URI_TOO_LONG,
    PDGW_API_ERR_KIND_COUNT
} pdgw_api_err_kind_t;

#define PDGW_API_ERR_MESSAGE_MAX 512
#define PDGW_API_ERR_PARAM_MAX   128
#define PDGW_API_ERR_CODE_MAX    64

/* One client-facing error. Plain value, no heap: safe to keep on the stack. */
typedef struct pdgw_api_error {
    pdgw_api_err_kind_t kind;
    char message[PDGW_API_ERR_MESSAGE_MAX];
    char param[PDGW_API_ERR_PARAM_MAX]; /* "" = JSON null */
    char code[PDGW_API_ERR_CODE_MAX];   /* "" = the kind's default code */
    char type[PDGW_API_ERR_CODE_MAX];   /* "" = the kind's OpenAI type; else an override such
                                           as "pd_prefill_error" (HTTP status unchanged) */
} pdgw_api_error_t;

/* HTTP status of <kind> (400..504); 500 for out-of-range values. */
int pdgw_api_err_http_status(pdgw_api_err_kind_t kind);
/* OpenAI "type" string of <kind>, e.g. "invalid_request_error". */
const char *pdgw_api_err_type(pdgw_api_err_kind_t kind);
/* Default "code" of <kind>, e.g. "invalid_api_key", "upstream_error"; may be NULL (JSON null). */
const char *pdgw_api_err_default_code(pdgw_api_err_kind_t kind);
/* Kind that matches an HTTP status (e.g. an upstream's 4xx relayed as is); BAD_GATEWAY if none. */
pdgw_api_err_kind_t pdgw_api_err_kind_from_http(int http_status);

/*
 * Fill <err>: <kind>, <param> (NULL = null), message from printf-style <fmt>.
 * The code and type are reset to the kind's defaults; pdgw_api_error_set_code / _set_type
 * override them afterwards.
 * Texts longer than the fields are truncated.
 */
void pdgw_api_error_set(pdgw_api_error_t *err, pdgw_api_err_kind_t kind, const char *param,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Set only the code (NULL or "" = default). */
void pdgw_api_error_set_code(pdgw_api_error_t *err, const char *code);
/* Override the "type" (NULL or "" = the kind's type); the HTTP status stays the kind's. */
void pdgw_api_error_set_type(pdgw_api_error_t *err, const char *type);
/* HTTP status of <err>. */
int pdgw_api_error_http_status(const pdgw_api_error_t *err);

/* New reference: {"error":{"message":..,"type":..,"param":..|null,"code":..|null}}. NULL on OOM. */
json_t *pdgw_api_error_json(const pdgw_api_error_t *err);

/*
 * Compact JSON body of <err> followed by "\n". Returns malloc'd text (caller frees with free()),
 * length in *len_out (may be NULL). NULL on OOM.
 */
char *pdgw_api_error_body(const pdgw_api_error_t *err, size_t *len_out);

/*
 * The same error as one SSE event: "data: {...}\n\n". With <with_done> non-zero,
 * "data: [DONE]\n\n" follows. malloc'd, caller frees; NULL on OOM.
 */
char *pdgw_api_error_sse(const pdgw_api_error_t *err, int with_done, size_t *len_out);

/* One-shot helper: body for (kind, param, message) without a struct. malloc'd, caller frees. */
char *pdgw_api_error_body_make(pdgw_api_err_kind_t kind, const char *param, const char *message,
                               size_t *len_out);

#endif /* PDGW_ERRORS_H */
