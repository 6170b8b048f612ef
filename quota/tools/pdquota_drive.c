/*
 * pdquota_drive.c - one "replica" of libpdquota for integration tests and measurements.
 *
 * It builds a quota object for one tenant ("t", model "m") from its flags and then reads
 * commands on stdin, one per line, answering one line each on stdout:
 *
 *   admit N              N admissions (each released at once): counts and admit cost
 *   run MS               admit as fast as budgets allow for MS ms (releasing each)
 *   wait-connected B MS  until the store's connected state is B (0/1), at most MS ms
 *   state                store state and how many log lines were seen
 *   usage                the usage JSON (totals) on one line
 *   bench N              ns per admit+release over N rounds with unlimited budgets
 *   quit
 *
 * Flags: --store URL --rpm N --tpm N --replicas N --fail open|closed --sync-ms N
 *        --timeout-ms N --backoff-ms N --lease-fraction F --prefix P
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "pdquota/pdquota.h"

static atomic_uint log_warn, log_info;

static void on_log(void *arg, int level, const char *msg)
{
    (void)arg;
    if (level > 0)
        atomic_fetch_add(&log_warn, 1);
    else
        atomic_fetch_add(&log_info, 1);
    fprintf(stderr, "pdquota-drive: %s: %s\n", level > 0 ? "warn" : "info", msg);
}

static void nap_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

typedef struct counts {
    uint64_t admitted, refused, unavailable, max_ns, sum_ns, n, first_ns, last_ns;
} counts_t;

static void admit_once(pdq_t *q, counts_t *c)
{
    pdq_ticket_t *t = NULL;
    pdq_verdict_t v;
    uint64_t t0 = pdb_clock_mono_ns();
    pdq_status_t st = pdq_admit(q, 0, "m", 10, 10, NULL, NULL, &t, &v);
    uint64_t dt = pdb_clock_mono_ns() - t0;
    c->n++;
    c->sum_ns += dt;
    if (dt > c->max_ns)
        c->max_ns = dt;
    if (st == PDQ_OK) {
        if (c->admitted == 0)
            c->first_ns = t0;
        c->last_ns = t0;
        c->admitted++;
        pdq_reconcile(t, 10, 0, 10);
        pdq_release(t);
    } else if (st == PDQ_REFUSED && v.code == PDQ_CODE_STORE_UNAVAILABLE) {
        c->unavailable++;
    } else {
        c->refused++;
    }
}

static void print_counts(const counts_t *c)
{
    printf("ok admitted=%" PRIu64 " refused=%" PRIu64 " unavailable=%" PRIu64 " max_ns=%" PRIu64
           " avg_ns=%" PRIu64 " first_ns=%" PRIu64 " last_ns=%" PRIu64 "\n",
           c->admitted, c->refused, c->unavailable, c->max_ns, c->n ? c->sum_ns / c->n : 0,
           c->first_ns, c->last_ns);
}

static void bench(uint64_t rounds, pdq_t *q)
{
    uint64_t t0 = pdb_clock_mono_ns();
    for (uint64_t i = 0; i < rounds; i++) {
        pdq_ticket_t *t = NULL;
        if (pdq_admit(q, 0, "m", 10, 10, NULL, NULL, &t, NULL) == PDQ_OK)
            pdq_release(t);
    }
    uint64_t dt = pdb_clock_mono_ns() - t0;
    printf("ok ns_per_admit_release=%.1f\n", rounds ? (double)dt / (double)rounds : 0.0);
}

int main(int argc, char **argv)
{
    pdq_tenant_config_t tc = {.name = "t", .weight = 1};
    pdq_model_budget_t mb = {.model = "m"};
    tc.models = &mb;
    tc.n_models = 1;
    pdq_config_t cfg = {.tenants = &tc, .n_tenants = 1, .log = on_log};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (strcmp(k, "--store") == 0)
            cfg.store.url = v;
        else if (strcmp(k, "--rpm") == 0)
            tc.budget.rpm = strtoull(v, NULL, 10);
        else if (strcmp(k, "--tpm") == 0)
            tc.budget.tpm = strtoull(v, NULL, 10);
        else if (strcmp(k, "--replicas") == 0)
            cfg.store.expected_replicas = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(k, "--fail") == 0)
            cfg.store.fail_mode = strcmp(v, "closed") == 0 ? PDQ_FAIL_CLOSED : PDQ_FAIL_OPEN;
        else if (strcmp(k, "--sync-ms") == 0)
            cfg.store.sync_interval_ms = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(k, "--timeout-ms") == 0)
            cfg.store.connect_timeout_ms = cfg.store.command_timeout_ms =
                (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(k, "--backoff-ms") == 0)
            cfg.store.backoff_max_ms = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(k, "--lease-fraction") == 0)
            cfg.store.lease_fraction = strtod(v, NULL);
        else if (strcmp(k, "--prefix") == 0)
            cfg.store.key_prefix = v;
        else {
            fprintf(stderr, "pdquota-drive: unknown flag %s\n", k);
            return 2;
        }
    }
    cfg.store.usage_interval_ms = 200;
    pdq_t *q = NULL;
    char err[256] = "";
    pdq_status_t st = pdq_new(&cfg, NULL, &q, err, sizeof(err));
    if (st != PDQ_OK) {
        fprintf(stderr, "pdquota-drive: %s (%s)\n", err, pdq_strerror(st));
        printf("error %s\n", err);
        return 1;
    }
    if ((st = pdq_start(q)) != PDQ_OK) {
        fprintf(stderr, "pdquota-drive: start: %s\n", pdq_strerror(st));
        pdq_free(q);
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    char line[256];
    while (fgets(line, sizeof(line), stdin)) {
        char cmd[32] = "";
        unsigned long long a = 0, b = 0;
        int n = sscanf(line, "%31s %llu %llu", cmd, &a, &b);
        if (n < 1)
            continue;
        counts_t c = {0};
        if (strcmp(cmd, "admit") == 0) {
            for (unsigned long long i = 0; i < a; i++)
                admit_once(q, &c);
            print_counts(&c);
        } else if (strcmp(cmd, "run") == 0) {
            uint64_t end = pdb_clock_mono_ns() + a * 1000000ull;
            while (pdb_clock_mono_ns() < end) {
                uint64_t before = c.admitted;
                admit_once(q, &c);
                if (c.admitted == before)
                    nap_us(200); /* pacing a refused client, not waiting for a condition */
            }
            print_counts(&c);
        } else if (strcmp(cmd, "wait-connected") == 0) {
            uint64_t end = pdb_clock_mono_ns() + b * 1000000ull;
            pdq_store_stats_t ss;
            for (;;) {
                pdq_store_stats(q, &ss);
                if (ss.connected == (a != 0) || pdb_clock_mono_ns() >= end)
                    break;
                nap_us(2000);
            }
            printf("%s\n", ss.connected == (a != 0) ? "ok" : "timeout");
        } else if (strcmp(cmd, "state") == 0) {
            pdq_store_stats_t ss;
            pdq_store_stats(q, &ss);
            printf("ok connected=%d errors=%" PRIu64 " reconnects=%" PRIu64 " noscript=%" PRIu64
                   " syncs=%" PRIu64 " warn=%u info=%u\n",
                   ss.connected, ss.errors, ss.reconnects, ss.noscript_fallbacks, ss.syncs,
                   atomic_load(&log_warn), atomic_load(&log_info));
        } else if (strcmp(cmd, "usage") == 0) {
            json_t *u = pdq_usage_json(q, (uint32_t)a, NULL, NULL);
            char *s = u ? json_dumps(u, JSON_COMPACT) : NULL;
            printf("%s\n", s ? s : "null");
            free(s);
            json_decref(u);
        } else if (strcmp(cmd, "bench") == 0) {
            bench(a, q);
        } else if (strcmp(cmd, "quit") == 0) {
            break;
        } else {
            printf("error unknown command %s\n", cmd);
        }
    }
    pdq_free(q);
    return 0;
}
