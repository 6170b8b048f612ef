/*
 * pdgw_rate_limit.h - token buckets: one per API key, refilled at <rate> requests per second
 * up to <burst>.
 *
 * A key's bucket starts full, so a client that was idle may send <burst> requests at once
 * and then <rate> per second. The per-key table keeps a 64-bit keyed hash of the key, never
 * the key itself, and holds at most <max_keys> buckets: when it is full, buckets that have
 * refilled completely (they carry no state) are dropped; if every bucket is still busy, new
 * keys share one overflow bucket, so a flood of made-up keys cannot grow memory.
 *
 * No lock and no clock: the caller (pdgw_admit.c) locks and passes monotonic ms.
 */
#ifndef PDGW_RATE_LIMIT_H
#define PDGW_RATE_LIMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdgw_errors.h"

typedef struct pdgw_token_bucket {
    double rate;   /* tokens per second, > 0 */
    double burst;  /* capacity, >= 1 */
    double tokens; /* now available */
    uint64_t last_ms;
} pdgw_token_bucket_t;

/* A full bucket at <now_ms>. */
void pdgw_token_bucket_init(pdgw_token_bucket_t *b, double rate, double burst, uint64_t now_ms);
/* New rate/burst (reload) keeping what is left, capped at the new burst. */
void pdgw_token_bucket_set(pdgw_token_bucket_t *b, double rate, double burst, uint64_t now_ms);
/* Take one token: true, or false with *wait_ms (may be NULL) = ms until one is there. */
bool pdgw_token_bucket_take(pdgw_token_bucket_t *b, uint64_t now_ms, uint64_t *wait_ms);

typedef struct pdgw_rate_table pdgw_rate_table_t;

/* Hash of an API key as the table keys it (seeded per process). */
uint64_t pdgw_rate_key_hash(const char *key, size_t len);

/* A table of at most <max_keys> buckets (>= 1). */
pdgw_status_t pdgw_rate_table_create(size_t max_keys, pdgw_rate_table_t **out);
void pdgw_rate_table_destroy(pdgw_rate_table_t *t);
/* Take one token from the bucket of key hash <h> (created full with <rate>, <burst> on first
 * use; an existing bucket takes these values if they changed). */
bool pdgw_rate_table_take(pdgw_rate_table_t *t, uint64_t h, double rate, double burst,
                          uint64_t now_ms, uint64_t *wait_ms);
/* Buckets held now (tests, metrics). */
size_t pdgw_rate_table_size(const pdgw_rate_table_t *t);

/* Parse "RPS" or "RPS:BURST" (RPS > 0, BURST >= 1; burst defaults to max(1, RPS)). */
pdgw_status_t pdgw_rate_parse(const char *text, double *rate, double *burst);

#endif /* PDGW_RATE_LIMIT_H */
