/*
 * sched_kvev_summary.c - one KV-event message, framed as it arrives, read into the summary
 * of pdsched/kvev.h. The framing rules are the subscriber's (sched_kvev_sub.c: a live message
 * is exactly three frames, a replay answer three or four, its sequence frame 8 or 24 bytes);
 * the payload goes through sched_kvev_decode(), the decoder the index is fed by.
 */
#include <stdio.h>
#include <string.h>

#include <pdsched/kvev.h>

#include "sched_kvev_int.h"

static uint64_t be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Say why in out->error and refuse. */
#define REFUSE(out, ...)                                                                           \
    (snprintf((out)->error, sizeof((out)->error), __VA_ARGS__), SCHED_ERR_INVALID)

static void saw_block_size(sched_kvev_summary_t *out, uint32_t bs)
{
    size_t i, kept = out->n_block_sizes < SCHED_KVEV_SUMMARY_SIZES ? out->n_block_sizes
                                                                   : SCHED_KVEV_SUMMARY_SIZES;
    if (bs == 0)
        return;
    for (i = 0; i < kept; i++) {
        if (out->block_sizes[i] == bs)
            return;
    }
    /* beyond the kept ones a size may be counted twice: the count then says "many" */
    if (out->n_block_sizes < SCHED_KVEV_SUMMARY_SIZES)
        out->block_sizes[out->n_block_sizes] = bs;
    out->n_block_sizes++;
}

sched_status_t sched_kvev_summarize(sched_kvev_source_t from, const sched_kvev_frame_t *frames,
                                    size_t n_frames, sched_kvev_summary_t *out)
{
    const sched_kvev_frame_t *seq, *payload;
    sched_kvev_batch_t b;
    char err[128] = "";
    size_t i;

    if (out == NULL)
        return SCHED_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    out->dp_rank = -1;
    if (frames == NULL && n_frames > 0)
        return REFUSE(out, "no frames given (%zu announced)", n_frames);
    if (from == SCHED_KVEV_FROM_PUB) {
        if (n_frames != 3)
            return REFUSE(out, "%zu frame(s), a live message has 3 (topic, seq, payload)",
                          n_frames);
        seq = &frames[1];
    } else {
        if (n_frames != 3 && n_frames != 4)
            return REFUSE(out,
                          "%zu frame(s), a replay answer has 3 or 4 (empty, [topic,] seq, "
                          "payload)",
                          n_frames);
        if (frames[0].len != 0)
            return REFUSE(out, "a replay answer starts with an empty frame, not %zu bytes",
                          frames[0].len);
        seq = &frames[n_frames - 2];
    }
    payload = seq + 1;
    if ((seq->len != 8 && seq->len != 24) || seq->data == NULL)
        return REFUSE(out, "a sequence frame of %zu bytes (8, or 24 with a publisher id)",
                      seq->len);
    out->seq = be64(seq->data);
    out->has_publisher_id = seq->len == 24;
    if (from == SCHED_KVEV_FROM_REPLAY && out->seq == UINT64_MAX) {
        out->replay_end = true;
        return SCHED_OK;
    }
    if (payload->data == NULL && payload->len > 0)
        return REFUSE(out, "a payload of %zu bytes without data", payload->len);
    if (sched_kvev_decode(payload->data, payload->len, &b, err, sizeof(err)) != SCHED_OK) {
        snprintf(out->error, sizeof(out->error), "payload: %s", err[0] ? err : "undecodable");
        return SCHED_ERR_INVALID;
    }
    out->dp_rank = b.dp_rank;
    out->n_events = b.n_events;
    out->n_unknown = b.n_unknown;
    for (i = 0; i < b.n_events; i++) {
        const sched_kvev_event_t *e = &b.events[i];
        if (e->kind == SCHED_KVEV_STORED) {
            out->n_stored++;
            saw_block_size(out, e->block_size);
        } else if (e->kind == SCHED_KVEV_REMOVED) {
            out->n_removed++;
        } else if (e->kind == SCHED_KVEV_CLEARED) {
            out->n_cleared++;
        }
    }
    sched_kvev_batch_free(&b);
    return SCHED_OK;
}
