/*
 * pdgw_fwd_setup.h - bringing up the configured forwarder: descriptor lookup, mode check,
 * configure and plan, in one place for the server's start-up and for `--check-config`
 * (which also asks the forwarder about every configured instance).
 */
#ifndef PDGW_FWD_SETUP_H
#define PDGW_FWD_SETUP_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>
#include <pdgw/forwarder.h>
#include <pdsched/sched.h>

#include "pdgw_errors.h"
#include "pdgw_req_info.h"

typedef struct pdgw_fwd_setup {
    const pdgw_fwd_desc_t *desc;
    void *ctx; /* the forwarder's global context (owned; pdgw_fwd_teardown frees it) */
    pdgw_fwd_plan_t plan;
} pdgw_fwd_setup_t;

/*
 * Find <protocol>'s forwarder, check it supports <mode>, run its configure with <options>
 * (borrowed; NULL = no options) and its plan. <check_only> tells the forwarder to open no
 * socket and start no thread; KV control services it opens go into <kv_svcs> (the caller's,
 * borrowed; NULL with check_only). On error <out> is untouched and <err> (errlen bytes) names
 * the config key at fault.
 */
pdgw_status_t pdgw_fwd_setup(const char *protocol, pdgw_mode_t mode, const json_t *options,
                             unsigned n_workers, bool check_only, pdgw_fwd_kv_svcs_t *kv_svcs,
                             pdgw_fwd_setup_t *out, char *err, size_t errlen);

/* Whether <mode> for the client's PD control fields suits the set-up forwarder: 'pass' only
 * for a plain proxy (a PD forwarder writes those fields itself, and a client must not name
 * KV peers). PDGW_ERR_INVALID with the reason in <err> otherwise. */
pdgw_status_t pdgw_fwd_check_client_pd_fields(const pdgw_fwd_setup_t *s, pdgw_pd_fields_mode_t mode,
                                              char *err, size_t errlen);

/* Free what pdgw_fwd_setup made (the forwarder's destroy). Safe on a zeroed struct. */
void pdgw_fwd_teardown(pdgw_fwd_setup_t *s);

/* Whether <inst> has what the protocol needs: its `attrs:` against the protocol's declared
 * instance attributes (when it declares them), then the forwarder's check_instance op.
 * PDGW_OK when it has; else PDGW_ERR_INVALID with the reason in <err>. */
pdgw_status_t pdgw_fwd_check_instance(const pdgw_fwd_setup_t *s, const pdgw_instance_t *inst,
                                      char *err, size_t errlen);

/* The forwarder's read-only view <v> of scheduler instance <si> (strings borrowed from it). */
void pdgw_instance_view_from_sched(pdgw_instance_t *v, sched_instance_t *si);

#endif
