/*
 * pdgw_phases.c - the hook tables of the request path (pdgw_phases.h): fixed arrays filled
 * once by the wiring, read unlocked by every worker afterwards.
 */
#include "pdgw_phases.h"

#include <stddef.h>
#include <string.h>

#include "pdgw_server_int.h"

typedef bool (*enter_fn)(pdgw_wf_t *wf);
typedef pdgw_status_t (*server_start_fn)(pdgw_server_t *srv, char *err, size_t errlen);
typedef void (*server_stop_fn)(pdgw_server_t *srv);
typedef void (*worker_fn)(pdgw_worker_t *w);
typedef void (*free_fn_t)(pdgw_req_t *r); /* also an arrive hook */

#define LIST(type, name)                                                                           \
    struct {                                                                                       \
        type fn[PDGW_PHASE_MAX];                                                                   \
        size_t n;                                                                                  \
    } name

static struct {
    LIST(free_fn_t, arrive);
    LIST(pdgw_req_check_fn, route);
    LIST(pdgw_req_check_fn, head);
    LIST(pdgw_req_check_fn, access);
    LIST(pdgw_req_check_fn, body[PDGW_ROUTE_COUNT]);
    LIST(enter_fn, enter[PDGW_ROUTE_COUNT]);
    LIST(pdgw_headers_fn, headers);
    LIST(pdgw_finish_fn, finish);
    LIST(free_fn_t, free);
    LIST(server_start_fn, server_start);
    LIST(server_stop_fn, server_stop);
    LIST(worker_fn, worker_stop);
    const pdgw_route_ops_t *ops[PDGW_ROUTE_COUNT];
} phases;

#define ADD(list, f)                                                                               \
    do {                                                                                           \
        if ((list).n >= PDGW_PHASE_MAX)                                                            \
            return PDGW_ERR_LIMIT;                                                                 \
        (list).fn[(list).n++] = (f);                                                               \
    } while (0)

pdgw_status_t pdgw_phase_arrive(void (*note)(pdgw_req_t *r))
{
    ADD(phases.arrive, note);
    return PDGW_OK;
}

pdgw_status_t pdgw_phase_route(pdgw_req_check_fn claim)
{
    ADD(phases.route, claim);
    return PDGW_OK;
}

pdgw_status_t pdgw_phase_head(pdgw_req_check_fn check)
{
    ADD(phases.head, check);
    return PDGW_OK;
}

pdgw_status_t pdgw_phase_access(pdgw_req_check_fn check)
{
    ADD(phases.access, check);
    return PDGW_OK;
}

pdgw_status_t pdgw_phase_body(pdgw_route_t route, pdgw_req_check_fn check)
{
    if (route >= PDGW_ROUTE_COUNT)
        return PDGW_ERR_INVALID;
    ADD(phases.body[route], check);
    return PDGW_OK;
}

pdgw_status_t pdgw_phase_enter(pdgw_route_t route, bool (*enter)(pdgw_wf_t *wf))
{
    if (route >= PDGW_ROUTE_COUNT)
        return PDGW_ERR_INVALID;
    ADD(phases.enter[route], enter);
    return PDGW_OK;
}

pdgw_status_t pdgw_phase_headers(pdgw_headers_fn add)
{
    ADD(phases.headers, add);
    return PDGW_OK;
}

pdgw_status_t pdgw_phase_finish(pdgw_finish_fn done)
{
    ADD(phases.finish, done);
    return PDGW_OK;
}

pdgw_status_t pdgw_phase_free(void (*free_fn)(pdgw_req_t *r))
{
    ADD(phases.free, free_fn);
    return PDGW_OK;
}

void pdgw_phase_route_ops(pdgw_route_t route, const pdgw_route_ops_t *ops)
{
    if (route < PDGW_ROUTE_COUNT)
        phases.ops[route] = ops;
}

pdgw_status_t pdgw_phase_server(server_start_fn start, server_stop_fn stop)
{
    if (phases.server_start.n >= PDGW_PHASE_MAX || phases.server_stop.n >= PDGW_PHASE_MAX)
        return PDGW_ERR_LIMIT;
    phases.server_start.fn[phases.server_start.n++] = start;
    phases.server_stop.fn[phases.server_stop.n++] = stop;
    return PDGW_OK;
}

pdgw_status_t pdgw_phase_worker_stop(worker_fn stop)
{
    ADD(phases.worker_stop, stop);
    return PDGW_OK;
}

/* ---------------------------------------------------------------- running them */

void pdgw_phases_arrive(pdgw_req_t *r)
{
    for (size_t i = 0; i < phases.arrive.n; i++)
        phases.arrive.fn[i](r);
}

bool pdgw_phases_claim_route(pdgw_req_t *r)
{
    for (size_t i = 0; i < phases.route.n; i++)
        if (phases.route.fn[i](r))
            return true;
    return false;
}

static bool run_checks(const pdgw_req_check_fn *fn, size_t n, pdgw_req_t *r)
{
    for (size_t i = 0; i < n; i++)
        if (!fn[i](r))
            return false;
    return true;
}

bool pdgw_phases_head(pdgw_req_t *r)
{
    return run_checks(phases.head.fn, phases.head.n, r);
}

bool pdgw_phases_access(pdgw_req_t *r)
{
    return run_checks(phases.access.fn, phases.access.n, r);
}

bool pdgw_phases_body(pdgw_req_t *r)
{
    return run_checks(phases.body[r->route].fn, phases.body[r->route].n, r);
}

bool pdgw_phases_enter(pdgw_wf_t *wf, pdgw_route_t route)
{
    for (size_t i = 0; i < phases.enter[route].n; i++)
        if (!phases.enter[route].fn[i](wf))
            return false;
    return true;
}

void pdgw_phases_headers(const pdgw_req_t *r, pdgw_headers_kind_t kind, pdgw_hdr_out_t *o)
{
    for (size_t i = 0; i < phases.headers.n; i++)
        phases.headers.fn[i](r, kind, o);
}

void pdgw_phases_finish(pdgw_req_t *r, int status, double dur_s, bool disconnected, uint64_t now_ns)
{
    for (size_t i = 0; i < phases.finish.n; i++)
        phases.finish.fn[i](r, status, dur_s, disconnected, now_ns);
}

void pdgw_phases_free(pdgw_req_t *r)
{
    for (size_t i = 0; i < phases.free.n; i++)
        phases.free.fn[i](r);
}

const pdgw_route_ops_t *pdgw_phases_route_ops(pdgw_route_t route)
{
    return route < PDGW_ROUTE_COUNT ? phases.ops[route] : NULL;
}

pdgw_status_t pdgw_phases_server_start(pdgw_server_t *srv, char *err, size_t errlen)
{
    for (size_t i = 0; i < phases.server_start.n; i++) {
        pdgw_status_t st =
            phases.server_start.fn[i] ? phases.server_start.fn[i](srv, err, errlen) : PDGW_OK;
        if (st != PDGW_OK) {
            while (i-- > 0) /* those started are stopped again, newest first */
                if (phases.server_stop.fn[i] != NULL)
                    phases.server_stop.fn[i](srv);
            return st;
        }
    }
    return PDGW_OK;
}

void pdgw_phases_server_stop(pdgw_server_t *srv)
{
    for (size_t i = phases.server_stop.n; i-- > 0;)
        if (phases.server_stop.fn[i] != NULL)
            phases.server_stop.fn[i](srv);
}

void pdgw_phases_worker_stop(pdgw_worker_t *w)
{
    for (size_t i = phases.worker_stop.n; i-- > 0;)
        if (phases.worker_stop.fn[i] != NULL)
            phases.worker_stop.fn[i](w);
}
