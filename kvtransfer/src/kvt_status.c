/*
 * kvt_status.c -- status strings (allocation and the clock are in libpdb).
 */
#include "kvt/kvt_status.h"

#include <string.h>

struct status_desc {
    const char *name;
    const char *text;
};

/* Indexed by -status for errors (0 = KVT_OK); KVT_INPROGRESS handled apart. */
static const struct status_desc status_table[] = {
    [0] = {"KVT_OK", "success"},
    [1] = {"KVT_ERR_INVALID", "invalid argument"},
    [2] = {"KVT_ERR_NOMEM", "out of memory"},
    [3] = {"KVT_ERR_NOT_FOUND", "not found"},
    [4] = {"KVT_ERR_EXISTS", "already exists"},
    [5] = {"KVT_ERR_TIMEOUT", "timed out"},
    [6] = {"KVT_ERR_NOSPACE", "not enough free pages"},
    [7] = {"KVT_ERR_TOO_LARGE", "request larger than the whole buffer"},
    [8] = {"KVT_ERR_BOUNDS", "out of the registered region's bounds"},
    [9] = {"KVT_ERR_ACCESS", "access to pages not granted"},
    [10] = {"KVT_ERR_DOUBLE_FREE", "double free of a page"},
    [11] = {"KVT_ERR_UNDERFLOW", "count dropped below zero"},
    [12] = {"KVT_ERR_BUSY", "resource busy"},
    [13] = {"KVT_ERR_BACKOFF", "peer backed off (circuit breaker open)"},
    [14] = {"KVT_ERR_BACKPRESSURE", "pinned pages above the high-water mark"},
    [15] = {"KVT_ERR_PEER", "peer failed or connection lost"},
    [16] = {"KVT_ERR_PROTO", "malformed message"},
    [17] = {"KVT_ERR_MSG_TYPE", "unknown message type"},
    [18] = {"KVT_ERR_MSG_FIELD", "missing or mistyped message field"},
    [19] = {"KVT_ERR_LIMIT", "size limit exceeded"},
    [20] = {"KVT_ERR_CANCELLED", "cancelled"},
    [21] = {"KVT_ERR_CLOSED", "closed or shutting down"},
    [22] = {"KVT_ERR_IO", "I/O error"},
    [23] = {"KVT_ERR_ALLOC_FAILED", "remote allocation failed"},
    [24] = {"KVT_ERR_CONFIG", "invalid configuration"},
    [25] = {"KVT_ERR_UNSUPPORTED", "not supported"},
    [26] = {"KVT_ERR_STATE", "invalid state for this call"},
};

static const struct status_desc *status_lookup(kvt_status_t status)
{
    if (status == KVT_INPROGRESS) {
        static const struct status_desc inprogress = {"KVT_INPROGRESS", "in progress"};
        return &inprogress;
    }
    if (status > 0 || status <= KVT_ERR_LAST)
        return NULL;
    return &status_table[-(int)status];
}

const char *kvt_strerror(kvt_status_t status)
{
    const struct status_desc *d = status_lookup(status);
    return d != NULL ? d->text : "unknown status";
}

const char *kvt_status_name(kvt_status_t status)
{
    const struct status_desc *d = status_lookup(status);
    return d != NULL ? d->name : "KVT_UNKNOWN";
}
