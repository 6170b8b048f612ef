/*
 * kvev.h - what one KV-event message of an engine says, for a caller outside the scheduler
 * (the gateway's engine doctor) that listens to a publisher itself and wants the scheduler's
 * own reading of it, not a second decoder.
 *
 * A message is the frames as they arrive (vllm/distributed/kv_events.py, ZmqEventPublisher):
 *   live, from a SUB socket:       [topic, seq, payload]
 *   a replayed batch, from a DEALER to the replay ROUTER:
 *                                  [empty, seq, payload] or [empty, topic, seq, payload]
 *   the end of a replay:           [empty, seq = -1, anything]
 * seq is 8 bytes big-endian, or 24 (the sequence, then 16 bytes naming the publisher's
 * lifetime). The payload is decoded by the same decoder the subscriber feeds its index with,
 * so whatever the summary calls undecodable the precise-prefix index drops too.
 */
#ifndef PDSCHED_KVEV_H
#define PDSCHED_KVEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdsched/sched.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where a message came from: the frames are laid out differently. */
typedef enum sched_kvev_source {
    SCHED_KVEV_FROM_PUB = 0,    /* the engine's PUB socket (live batches) */
    SCHED_KVEV_FROM_REPLAY = 1, /* its replay ROUTER, read through a DEALER */
} sched_kvev_source_t;

/* One frame as received: borrowed, <len> bytes at <data>. */
typedef struct sched_kvev_frame {
    const void *data;
    size_t len;
} sched_kvev_frame_t;

/* Distinct block sizes one summary keeps (in the order first seen). */
#define SCHED_KVEV_SUMMARY_SIZES 4

typedef struct sched_kvev_summary {
    bool replay_end;       /* the replay's end marker: no batch, nothing below is set */
    uint64_t seq;          /* the message's sequence number */
    bool has_publisher_id; /* a 24-byte sequence frame */
    size_t n_events;       /* events decoded (stored + removed + cleared) */
    size_t n_stored, n_removed, n_cleared;
    size_t n_unknown; /* events of a type the decoder does not know (skipped) */
    /* block sizes the BlockStored events carry: the first SCHED_KVEV_SUMMARY_SIZES distinct
     * ones, and how many distinct ones there were */
    uint32_t block_sizes[SCHED_KVEV_SUMMARY_SIZES];
    size_t n_block_sizes;
    int64_t dp_rank; /* the batch's data_parallel_rank; -1 when absent */
    char error[160]; /* why the message is not one pdgw decodes; "" when it is */
} sched_kvev_summary_t;

/*
 * Read one KV-event message of <n_frames> frames from <from> into *out (always written).
 * SCHED_OK for a batch (or a replay's end); SCHED_ERR_INVALID when the framing or the payload
 * is not what pdgw's subscriber takes, with the reason in out->error. Thread-safe; allocates
 * only while decoding and frees before returning.
 */
sched_status_t sched_kvev_summarize(sched_kvev_source_t from, const sched_kvev_frame_t *frames,
                                    size_t n_frames, sched_kvev_summary_t *out);

#ifdef __cplusplus
}
#endif

#endif /* PDSCHED_KVEV_H */
