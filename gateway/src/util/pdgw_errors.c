/*
 * pdgw_errors.c - status texts and OpenAI-style error replies.
 */
#include "pdgw_errors.h"
#include "pdgw/forwarder.h" /* pdgw_phase_t, pdgw_phase_name */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *pdgw_strerror(pdgw_status_t status)
{
    switch (status) {
    case PDGW_INPROGRESS:
        return "in progress";
    case PDGW_OK:
        return "success";
    case PDGW_ERR_NOMEM:
        return "out of memory";
    case PDGW_ERR_INVALID:
        return "invalid value";
    case PDGW_ERR_PARSE:
        return "parse error";
    case PDGW_ERR_NOT_FOUND:
        return "not found";
    case PDGW_ERR_EXISTS:
        return "already exists";
    case PDGW_ERR_IO:
        return "input/output error";
    case PDGW_ERR_LIMIT:
        return "limit reached";
    case PDGW_ERR_TOO_LARGE:
        return "too large";
    case PDGW_ERR_UNSUPPORTED:
        return "not supported";
    case PDGW_ERR_TIMEOUT:
        return "timed out";
    case PDGW_ERR_CONNECT:
        return "connection failed";
    case PDGW_ERR_UPSTREAM:
        return "upstream error";
    case PDGW_ERR_CANCELLED:
        return "cancelled";
    case PDGW_ERR_BUSY:
        return "busy";
    case PDGW_ERR_NO_INSTANCE:
        return "no usable instance";
    case PDGW_ERR_AUTH:
        return "authentication failed";
    case PDGW_ERR_ABI:
        return "ABI version mismatch";
    case PDGW_ERR_STATE:
        return "invalid state";
    case PDGW_ERR_SYSTEM:
        return "system call failed";
    case PDGW_ERR_CLOSED:
        return "closed";
    }
    return "unknown status";
}

/* One row per kind: HTTP status, OpenAI type, default code. */
static const struct {
    int http;
    const char *type;
    const char *code;
} kind_table[PDGW_API_ERR_KIND_COUNT] = {
    [PDGW_API_ERR_BAD_REQUEST] = {400, "invalid_request_error", NULL},
    [PDGW_API_ERR_UNAUTHORIZED] = {401, "authentication_error", "invalid_api_key"},
    [PDGW_API_ERR_NOT_FOUND] = {404, "not_found_error", "not_found"},
    [PDGW_API_ERR_METHOD_NOT_ALLOWED] = {405, "invalid_request_error", "method_not_allowed"},
    [PDGW_API_ERR_TOO_LARGE] = {413, "invalid_request_error", "request_too_large"},
    [PDGW_API_ERR_RATE_LIMITED] = {429, "rate_limit_error", "rate_limit_exceeded"},
    [PDGW_API_ERR_INTERNAL] = {500, "server_error", "internal_error"},
    [PDGW_API_ERR_BAD_GATEWAY] = {502, "upstream_error", "upstream_error"},
    [PDGW_API_ERR_UNAVAILABLE] = {503, "service_unavailable_error", "service_unavailable"},
    [PDGW_API_ERR_TIMEOUT] = {504, "timeout_error", "timeout"},
    [PDGW_API_ERR_URI_TOO_LONG] = {414, "invalid_request_error", "uri_too_long"},
};

static int kind_ok(pdgw_api_err_kind_t kind)
{
    return (unsigned)kind < PDGW_API_ERR_KIND_COUNT;
}

int pdgw_api_err_http_status(pdgw_api_err_kind_t kind)
{
    return kind_ok(kind) ? kind_table[kind].http : 500;
}

const char *pdgw_api_err_type(pdgw_api_err_kind_t kind)
{
    return kind_ok(kind) ? kind_table[kind].type : "server_error";
}

const char *pdgw_api_err_default_code(pdgw_api_err_kind_t kind)
{
    return kind_ok(kind) ? kind_table[kind].code : "internal_error";
}

pdgw_api_err_kind_t pdgw_api_err_kind_from_http(int http_status)
{
    for (int k = 0; k < PDGW_API_ERR_KIND_COUNT; k++) {
        if (kind_table[k].http == http_status)
            return (pdgw_api_err_kind_t)k;
    }
    if (http_status == 408)
        return PDGW_API_ERR_TIMEOUT;
    if (http_status == 422 || (http_status >= 400 && http_status < 500))
        return PDGW_API_ERR_BAD_REQUEST;
    return PDGW_API_ERR_BAD_GATEWAY;
}

static void copy_field(char *dst, size_t cap, const char *src)
{
    if (src == NULL) {
        dst[0] = '\0';
        return;
    }
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

void pdgw_api_error_set(pdgw_api_error_t *err, pdgw_api_err_kind_t kind, const char *param,
                        const char *fmt, ...)
{
    if (err == NULL)
        return;
    err->kind = kind_ok(kind) ? kind : PDGW_API_ERR_INTERNAL;
    copy_field(err->param, sizeof(err->param), param);
    err->code[0] = '\0';
    err->type[0] = '\0';
    if (fmt == NULL) {
        err->message[0] = '\0';
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
}

void pdgw_api_error_set_code(pdgw_api_error_t *err, const char *code)
{
    if (err != NULL)
        copy_field(err->code, sizeof(err->code), code);
}

void pdgw_api_error_set_type(pdgw_api_error_t *err, const char *type)
{
    if (err != NULL)
        copy_field(err->type, sizeof(err->type), type);
}

int pdgw_api_error_http_status(const pdgw_api_error_t *err)
{
    return pdgw_api_err_http_status(err->kind);
}

json_t *pdgw_api_error_json(const pdgw_api_error_t *err)
{
    const char *code = err->code[0] != '\0' ? err->code : pdgw_api_err_default_code(err->kind);
    json_t *inner = json_object();
    json_t *outer = json_object();
    if (inner == NULL || outer == NULL)
        goto err_free;
    /* json_stringn keeps invalid UTF-8 out: fall back to a generic text if refused. */
    json_t *msg = json_string(err->message);
    if (msg == NULL)
        msg = json_string("invalid request");
    if (json_object_set_new(inner, "message", msg) != 0 ||
        json_object_set_new(
            inner, "type",
            json_string(err->type[0] != '\0' ? err->type : pdgw_api_err_type(err->kind))) != 0 ||
        json_object_set_new(inner, "param",
                            err->param[0] != '\0' ? json_string(err->param) : json_null()) != 0 ||
        json_object_set_new(inner, "code", code != NULL ? json_string(code) : json_null()) != 0)
        goto err_free;
    if (json_object_set_new(outer, "error", inner) != 0) {
        inner = NULL;
        goto err_free;
    }
    return outer;

err_free:
    json_decref(inner);
    json_decref(outer);
    return NULL;
}

/* Serialise <err> with optional prefix/suffix into one malloc'd string. */
static char *render(const pdgw_api_error_t *err, const char *prefix, const char *suffix,
                    size_t *len_out)
{
    json_t *j = pdgw_api_error_json(err);
    if (j == NULL)
        return NULL;
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (text == NULL)
        return NULL;
    size_t pl = strlen(prefix), tl = strlen(text), sl = strlen(suffix);
    char *out = malloc(pl + tl + sl + 1);
    if (out != NULL) {
        memcpy(out, prefix, pl);
        memcpy(out + pl, text, tl);
        memcpy(out + pl + tl, suffix, sl + 1);
        if (len_out != NULL)
            *len_out = pl + tl + sl;
    }
    free(text);
    return out;
}

char *pdgw_api_error_body(const pdgw_api_error_t *err, size_t *len_out)
{
    return render(err, "", "\n", len_out);
}

char *pdgw_api_error_sse(const pdgw_api_error_t *err, int with_done, size_t *len_out)
{
    return render(err, "data: ", with_done ? "\n\ndata: [DONE]\n\n" : "\n\n", len_out);
}

char *pdgw_api_error_body_make(pdgw_api_err_kind_t kind, const char *param, const char *message,
                               size_t *len_out)
{
    pdgw_api_error_t e;
    pdgw_api_error_set(&e, kind, param, "%s", message != NULL ? message : "");
    return pdgw_api_error_body(&e, len_out);
}

/* The failure phase as the X-PD-Failure-Phase header, logs and traces name it. */
const char *pdgw_phase_name(pdgw_phase_t phase)
{
    switch (phase) {
    case PDGW_PHASE_PREFILL:
        return "prefill";
    case PDGW_PHASE_KV_TRANSFER:
        return "kv_transfer";
    case PDGW_PHASE_DECODE:
        return "decode";
    default:
        return "gateway";
    }
}
