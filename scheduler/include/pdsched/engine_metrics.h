/*
 * engine_metrics.h - the names of the engine gauges the scheduler scrapes from an engine's
 * GET /metrics, per engine kind: one table (scheduler/src/sched_prom.c) that the scrape
 * parser reads and that a caller checking an engine (the gateway's engine doctor) lists.
 */
#ifndef PDSCHED_ENGINE_METRICS_H
#define PDSCHED_ENGINE_METRICS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sched_engine_kind {
    SCHED_ENGINE_VLLM = 0,
    SCHED_ENGINE_SGLANG = 1,
} sched_engine_kind_t;

/* What a gauge tells the scheduler. */
typedef enum sched_engine_gauge {
    SCHED_GAUGE_RUNNING = 0,  /* requests running (summed over label sets) */
    SCHED_GAUGE_WAITING = 1,  /* requests queued (summed) */
    SCHED_GAUGE_KV_USAGE = 2, /* KV cache used, a fraction (the largest label set) */
    SCHED_GAUGE_COUNT_ = 3,
} sched_engine_gauge_t;

/* How a name serves its gauge. */
typedef enum sched_metric_use {
    SCHED_METRIC_MAIN = 0,     /* the gauge's name */
    SCHED_METRIC_FALLBACK = 1, /* an older name, read only when the main one is absent */
    SCHED_METRIC_ADDS = 2,     /* adds to the gauge when present; never missed */
} sched_metric_use_t;

typedef struct sched_engine_metric {
    sched_engine_kind_t engine;
    sched_engine_gauge_t gauge;
    sched_metric_use_t use;
    const char *name; /* exactly as the engine exports it */
} sched_engine_metric_t;

/* Every name the scrape reads (static storage); *n_out entries. */
const sched_engine_metric_t *sched_engine_metric_names(size_t *n_out);
/* "running requests", "waiting requests", "KV cache usage"; "?" out of range. */
const char *sched_engine_gauge_name(sched_engine_gauge_t g);
/* "vLLM", "SGLang". */
const char *sched_engine_kind_name(sched_engine_kind_t k);

#ifdef __cplusplus
}
#endif

#endif /* PDSCHED_ENGINE_METRICS_H */
