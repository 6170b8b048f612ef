/* Status texts and the names of enums used in config, JSON and metrics. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "sched_int.h"

const char *sched_strerror(sched_status_t status)
{
    switch (status) {
    case SCHED_OK:
        return "ok";
    case SCHED_INPROGRESS:
        return "in progress";
    case SCHED_ERR_INVALID:
        return "invalid argument";
    case SCHED_ERR_NO_MEMORY:
        return "out of memory";
    case SCHED_ERR_NOT_FOUND:
        return "no such instance";
    case SCHED_ERR_EXISTS:
        return "already exists";
    case SCHED_ERR_NO_INSTANCE:
        return "no usable instance";
    case SCHED_ERR_ALREADY_RELEASED:
        return "booking leg already released";
    case SCHED_ERR_UNSUPPORTED:
        return "unsupported";
    case SCHED_ERR_STATE:
        return "wrong state";
    case SCHED_ERR_IO:
        return "I/O error";
    case SCHED_ERR_CLOSED:
        return "pool is shutting down";
    }
    return "unknown status";
}

const char *sched_role_name(sched_role_t role)
{
    switch (role) {
    case SCHED_ROLE_PREFILL:
        return "prefill";
    case SCHED_ROLE_DECODE:
        return "decode";
    case SCHED_ROLE_BOTH:
        return "both";
    }
    return "unknown";
}

sched_status_t sched_role_parse(const char *name, sched_role_t *role_out)
{
    static const sched_role_t roles[] = {SCHED_ROLE_PREFILL, SCHED_ROLE_DECODE, SCHED_ROLE_BOTH};

    if (!name)
        return SCHED_ERR_INVALID;
    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
        if (strcmp(name, sched_role_name(roles[i])) == 0) {
            *role_out = roles[i];
            return SCHED_OK;
        }
    }
    return SCHED_ERR_INVALID;
}

const char *sched_state_name(sched_state_t state)
{
    switch (state) {
    case SCHED_STATE_UP:
        return "up";
    case SCHED_STATE_DRAINING:
        return "draining";
    case SCHED_STATE_DOWN:
        return "down";
    }
    return "unknown";
}

const char *sched_source_name(sched_source_t source)
{
    switch (source) {
    case SCHED_SOURCE_STATIC:
        return "static";
    case SCHED_SOURCE_DNS:
        return "dns";
    case SCHED_SOURCE_K8S:
        return "kubernetes";
    case SCHED_SOURCE_ADMIN:
        return "admin";
    }
    return "unknown";
}

const char *sched_breaker_state_name(sched_breaker_state_t state)
{
    switch (state) {
    case SCHED_BREAKER_CLOSED:
        return "closed";
    case SCHED_BREAKER_OPEN:
        return "open";
    case SCHED_BREAKER_HALF_OPEN:
        return "half-open";
    }
    return "unknown";
}

static const char *const policy_names[SCHED_POLICY_COUNT] = {
    [SCHED_POLICY_ROUND_ROBIN] = "round-robin",       [SCHED_POLICY_RANDOM] = "random",
    [SCHED_POLICY_LEAST_LOAD] = "least-load",         [SCHED_POLICY_POWER_OF_TWO] = "power-of-two",
    [SCHED_POLICY_PREFIX_AWARE] = "prefix-aware",     [SCHED_POLICY_WEIGHTED] = "weighted",
    [SCHED_POLICY_PRECISE_PREFIX] = "precise-prefix", [SCHED_POLICY_SLO] = "slo",
};

const char *sched_policy_name(sched_policy_t policy)
{
    if ((unsigned)policy >= SCHED_POLICY_COUNT)
        return "unknown";
    return policy_names[policy];
}

sched_status_t sched_policy_parse(const char *name, sched_policy_t *policy_out)
{
    if (!name)
        return SCHED_ERR_INVALID;
    for (unsigned i = 0; i < SCHED_POLICY_COUNT; i++) {
        if (strcmp(name, policy_names[i]) == 0) {
            *policy_out = (sched_policy_t)i;
            return SCHED_OK;
        }
    }
    return SCHED_ERR_UNSUPPORTED;
}

const char *sched_outcome_name(sched_outcome_t outcome)
{
    switch (outcome) {
    case SCHED_OUTCOME_SUCCESS:
        return "success";
    case SCHED_OUTCOME_CANCELLED:
        return "cancelled";
    case SCHED_OUTCOME_CLIENT_ERROR:
        return "client_error";
    case SCHED_OUTCOME_OVERLOADED:
        return "overloaded";
    case SCHED_OUTCOME_CONNECT_ERROR:
        return "connect_error";
    case SCHED_OUTCOME_SERVER_ERROR:
        return "server_error";
    case SCHED_OUTCOME_TRANSFER_ERROR:
        return "transfer_error";
    case SCHED_OUTCOME_TIMEOUT:
        return "timeout";
    }
    return "unknown";
}

sched_outcome_t sched_outcome_from_http(int http_status)
{
    if (http_status <= 0)
        return SCHED_OUTCOME_CONNECT_ERROR;
    if (http_status == 429 || http_status == 503)
        return SCHED_OUTCOME_OVERLOADED;
    if (http_status >= 500)
        return SCHED_OUTCOME_SERVER_ERROR;
    if (http_status >= 400)
        return SCHED_OUTCOME_CLIENT_ERROR;
    return SCHED_OUTCOME_SUCCESS;
}

void sched_set_err(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;

    if (!err || err_len == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}
