/*
 * The record of received requests behind GET/DELETE /sim/requests: a bounded
 * ring of JSON entries (oldest dropped first), so tests can assert exactly
 * what each leg received.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

static pthread_mutex_t rlock = PTHREAD_MUTEX_INITIALIZER;
static json_t **ring;
static size_t cap, first_seq = 1, next_seq = 1;

int sim_record_init(int capacity)
{
    cap = (size_t)capacity;
    if (!cap)
        return 0; /* recording off (benchmarks) */
    ring = calloc(cap, sizeof(*ring));
    return ring ? 0 : -1;
}

void sim_record_fini(void)
{
    for (size_t i = 0; ring && i < cap; i++)
        json_decref(ring[i]);
    free(ring);
    ring = NULL;
}

uint64_t sim_record_add(json_t *entry)
{
    if (!cap) {
        json_decref(entry);
        return 0;
    }
    pthread_mutex_lock(&rlock);
    uint64_t seq = next_seq++;
    size_t slot = (size_t)(seq % cap);
    json_object_set_new(entry, "seq", json_integer((json_int_t)seq));
    /* When it arrived (unless the caller stamped it when the request had been read) and
     * (below, with its status) when it was answered: tests derive how many requests the
     * engine held at once from these. */
    if (json_object_get(entry, "t_recv_us") == NULL)
        json_object_set_new(entry, "t_recv_us", json_integer((json_int_t)(sim_now_ns() / 1000)));
    json_decref(ring[slot]);
    ring[slot] = entry;
    if (seq - first_seq >= cap)
        first_seq = seq - cap + 1;
    pthread_mutex_unlock(&rlock);
    return seq;
}

void sim_record_set(uint64_t seq, const char *key, json_t *value)
{
    if (!cap) {
        json_decref(value);
        return;
    }
    pthread_mutex_lock(&rlock);
    if (seq >= first_seq && seq < next_seq && ring[seq % cap]) {
        json_object_set(ring[seq % cap], key, value);
        if (strcmp(key, "status") == 0)
            json_object_set_new(ring[seq % cap], "t_done_us",
                                json_integer((json_int_t)(sim_now_ns() / 1000)));
    }
    pthread_mutex_unlock(&rlock);
    json_decref(value);
}

char *sim_record_dump(const char *request_id_filter)
{
    json_t *arr = json_array();
    pthread_mutex_lock(&rlock);
    for (uint64_t s = first_seq; cap && s < next_seq; s++) {
        json_t *e = ring[s % cap];
        if (!e)
            continue;
        if (request_id_filter) {
            /* A gateway mints its own X-Request-Id for engines; tests correlate a
             * client request with its legs through the forwarded X-Sim-Tag header. */
            const char *id = json_string_value(json_object_get(e, "request_id"));
            const char *tag =
                json_string_value(json_object_get(json_object_get(e, "headers"), "x-sim-tag"));
            if ((!id || strcmp(id, request_id_filter)) && (!tag || strcmp(tag, request_id_filter)))
                continue;
        }
        json_array_append_new(arr, json_deep_copy(e));
    }
    uint64_t total = next_seq - 1;
    uint64_t dropped = first_seq - 1;
    pthread_mutex_unlock(&rlock);
    json_t *root = json_pack("{s:o,s:I,s:I,s:I}", "requests", arr, "total", (json_int_t)total,
                             "dropped", (json_int_t)dropped, "capacity", (json_int_t)cap);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

void sim_record_clear(void)
{
    pthread_mutex_lock(&rlock);
    for (size_t i = 0; ring && i < cap; i++) {
        json_decref(ring[i]);
        ring[i] = NULL;
    }
    first_seq = next_seq;
    pthread_mutex_unlock(&rlock);
}
