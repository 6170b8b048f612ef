/*
 * fuzz_k8s_discovery.c - what the Kubernetes API server sends the scheduler's
 * EndpointSlice discovery (scheduler/src/sched_discovery_k8s_parse.c):
 *
 *   byte 0 even: one list response / EndpointSlice object
 *                (sched_k8s_slice_parse on the object and on every item of
 *                 an "items" array, annotations read from pod metadata,
 *                 endpoint descriptors built);
 *   byte 0 odd:  a watch stream, one JSON event per line
 *                (sched_k8s_event_parse, then the object as above,
 *                 resourceVersion, Status code of ERROR events).
 *
 * Never a crash, over-read or leak.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sched_discovery_k8s_int.h"

static void object(const json_t *obj)
{
    sched_k8s_slice_t s;
    sched_k8s_kv_t kv;
    char err[256], url[512];
    const json_t *meta;

    if (!json_is_object(obj))
        return;
    (void)sched_k8s_resource_version(obj);
    (void)sched_k8s_status_code(obj);
    meta = json_object_get(obj, "metadata");
    (void)sched_k8s_kv_from_annotations(json_object_get(meta, "annotations"), &kv, err,
                                        sizeof(err));
    memset(&s, 0, sizeof(s));
    if (sched_k8s_slice_parse(obj, "http", &s, err, sizeof(err)) == SCHED_OK) {
        for (size_t i = 0; i < s.n_eps; i++) {
            sched_instance_desc_t d;
            sched_k8s_endpoint_desc(&s.eps[i], &kv, SCHED_ROLE_PREFILL, "svc", url, sizeof(url),
                                    &d);
        }
        sched_k8s_slice_clear(&s);
    }
}

static void list(const json_t *root)
{
    const json_t *items = json_object_get(root, "items");
    size_t i;
    json_t *it;

    object(root);
    json_array_foreach(items, i, it) object(it);
}

static void watch(const char *text, size_t len)
{
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || text[i] == '\n') {
            json_error_t jerr;
            json_t *ev = json_loadb(text + start, i - start, 0, &jerr);
            if (ev != NULL) {
                sched_k8s_event_type_t type;
                const json_t *obj;
                char err[256];
                if (sched_k8s_event_parse(ev, &type, &obj, err, sizeof(err)) == SCHED_OK)
                    object(obj);
                json_decref(ev);
            }
            start = i + 1;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t jerr;
    json_t *root;

    if (size == 0)
        return 0;
    if (data[0] & 1) {
        watch((const char *)data + 1, size - 1);
        return 0;
    }
    root = json_loadb((const char *)data + 1, size - 1, 0, &jerr);
    if (root != NULL) {
        list(root);
        json_decref(root);
    }
    return 0;
}
