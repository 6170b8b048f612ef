/*
 * pdgw_doctor.h - the engine doctor: probes every instance of a pool for what pdgw and the
 * engines must agree on, without side effects on the engines (no allocation, no inference).
 *
 *   health        GET /health answers 200
 *   models        GET /v1/models lists the names the config gives the instance (and the
 *                 top-level `models:`); nothing configured: the names are reported
 *   metrics       GET /metrics has the load gauges pdgw scrapes (vLLM's or SGLang's names)
 *   protocol      what the forwarder will reach besides HTTP (pdgw_doctor_proto.c): the
 *                 Mooncake bootstrap's /query and its engine ids per DP rank, SGLang's
 *                 bootstrap /route, LMCache / libkvt alloc and init ports, the vllm-kvt side
 *                 channel (a ZeroMQ greeting: nothing is sent)
 *   kv-events     the publisher accepts connections, events arrive within the wait (or a
 *                 replay ROUTER answers), their block size agrees with the other instances
 *                 of the model, the DP ranks they carry
 *
 * `pdgw --check-engines` runs it once and prints the table; `check_engines_at_start` runs it
 * in the background after start-up and logs what it finds as warnings. Every probe has a
 * timeout (check_engines_timeout); instances are probed concurrently (up to
 * PDGW_DOCTOR_THREADS at a time), so the run is bounded by
 * ceil(instances / threads) x (probes x timeout + check_engines_events_wait).
 */
#ifndef PDGW_DOCTOR_H
#define PDGW_DOCTOR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <pdsched/sched.h>

#include "pdgw_config.h"
#include "pdgw_metrics.h"

#define PDGW_DOCTOR_THREADS 16

typedef enum pdgw_doctor_result {
    PDGW_DOCTOR_OK = 0,
    PDGW_DOCTOR_INFO = 1,  /* nothing to change, something to know */
    PDGW_DOCTOR_WARN = 2,  /* may be fine; says what to look at */
    PDGW_DOCTOR_ERROR = 3, /* pdgw and the engine disagree: requests will fail or route blind */
} pdgw_doctor_result_t;

/* "ok", "info", "warn", "error". */
const char *pdgw_doctor_result_name(pdgw_doctor_result_t r);

/* One line of the table. Strings owned by the report. */
typedef struct pdgw_doctor_row {
    char *instance; /* instance id, or "*" for the fleet */
    char *check;
    pdgw_doctor_result_t result;
    char *detail; /* what was seen */
    char *fix;    /* what to change; "" when nothing */
    size_t order; /* instance index, then insertion (for sorting) */
} pdgw_doctor_row_t;

typedef struct pdgw_doctor_report pdgw_doctor_report_t;

/* How to probe. <cfg> is borrowed for the run (protocol, models, timeouts, options). */
typedef struct pdgw_doctor_opts {
    const pdgw_config_t *cfg;
    uint64_t timeout_ms;     /* one probe; 0 = cfg->check_engines_timeout_ms */
    uint64_t events_wait_ms; /* listening to one publisher (cfg->check_engines_events_wait_ms) */
    int stop_fd;             /* readable = stop early (the start-up run at shutdown); -1 none */
} pdgw_doctor_opts_t;

/* Probe every instance of <pool> now (the pool may be running). *out is a new report (free
 * with pdgw_doctor_report_free); PDGW_ERR_NOMEM only. */
pdgw_status_t pdgw_doctor_run(const pdgw_doctor_opts_t *opts, sched_pool_t *pool,
                              pdgw_doctor_report_t **out);
void pdgw_doctor_report_free(pdgw_doctor_report_t *rep);

/* Rows, sorted by instance then check (borrowed from <rep>). */
const pdgw_doctor_row_t *pdgw_doctor_rows(const pdgw_doctor_report_t *rep, size_t *n_out);
/* Rows of result <r>. */
size_t pdgw_doctor_count(const pdgw_doctor_report_t *rep, pdgw_doctor_result_t r);

/* The table (aligned text) or one JSON object
 * {"ok", "errors", "warnings", "instances", "checks": [{instance, check, result, detail,
 * fix}]} to <out>. */
void pdgw_doctor_print(const pdgw_doctor_report_t *rep, bool json, FILE *out);

/*
 * `pdgw --check-engines`: wait for discovery (bounded by the probe timeout) when <cfg> has
 * any, run, print. Returns the exit status: 0 when no check failed, 1 otherwise.
 */
int pdgw_doctor_main(const pdgw_config_t *cfg, sched_pool_t *pool, bool json, FILE *out);

/* The start-up run: a thread that probes <pool> once and logs every finding that is not ok
 * as a warning; pdgw_engine_checks{result} counts the rows in <reg>.
 * create: copies what the probes read of <cfg> (main's config is handed to the reloader
 * before the pool starts), no thread yet. start: the thread (once the pool runs). */
typedef struct pdgw_doctor_bg pdgw_doctor_bg_t;
pdgw_status_t pdgw_doctor_bg_create(const pdgw_config_t *cfg, pdgw_doctor_bg_t **out);
pdgw_status_t pdgw_doctor_bg_start(pdgw_doctor_bg_t *bg, sched_pool_t *pool, pdgw_metrics_t *reg);
/* Stop early (probes end at their next wait), join, free. NULL-safe. */
void pdgw_doctor_bg_destroy(pdgw_doctor_bg_t *bg);

#endif /* PDGW_DOCTOR_H */
