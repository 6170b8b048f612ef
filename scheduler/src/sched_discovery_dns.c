/*
 * DNS discovery: one name per role ("host:port", typically a headless
 * Service), re-resolved every interval on the back-end's own thread (a
 * resolver may block). Every address becomes instance "<role>@<ip>:<port>"
 * with url http://<ip>:<port>; addresses that vanish are retired (drained,
 * removed once idle by the pool thread). A failed resolution keeps the
 * previous set.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "sched_int.h"

#define DNS_MAX_ADDRS 256

typedef struct dns_name {
    sched_role_t role;
    char host[256];
    int port;
    char **ids; /* published ids */
    size_t n_ids;
} dns_name_t;

typedef struct dns_state {
    sched_pool_t *pool;
    dns_name_t names[3];
    size_t n_names;
    uint64_t interval_ms;
    sched_resolve_fn resolve;
    void *resolve_arg;
    pthread_t thread;
    bool running;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stop;
} dns_state_t;

static sched_status_t resolve_getaddrinfo(void *arg, const char *host, sched_addr_t *addrs,
                                          size_t max_addrs, size_t *n_out)
{
    struct addrinfo hints, *res, *ai;
    size_t n = 0;
    int rc;

    (void)arg;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc == EAI_NONAME || rc == EAI_NODATA) {
        *n_out = 0;
        return SCHED_OK;
    }
    if (rc != 0)
        return SCHED_ERR_IO;
    for (ai = res; ai && n < max_addrs; ai = ai->ai_next) {
        const void *src;
        if (ai->ai_family == AF_INET)
            src = &((struct sockaddr_in *)ai->ai_addr)->sin_addr;
        else if (ai->ai_family == AF_INET6)
            src = &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
        else
            continue;
        if (inet_ntop(ai->ai_family, src, addrs[n].ip, sizeof(addrs[n].ip)))
            n++;
    }
    freeaddrinfo(res);
    *n_out = n;
    return SCHED_OK;
}

static void free_ids(char **ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sched_free(ids[i]);
    sched_free(ids);
}

static bool ids_contain(char *const *ids, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(ids[i], id) == 0)
            return true;
    }
    return false;
}

static void resolve_name(dns_state_t *st, dns_name_t *nm)
{
    sched_addr_t addrs[DNS_MAX_ADDRS];
    size_t n = 0, n_new = 0;
    char **ids;
    sched_status_t status;

    status = st->resolve(st->resolve_arg, nm->host, addrs, DNS_MAX_ADDRS, &n);
    if (status != SCHED_OK) {
        sched_pool_logf(st->pool, SCHED_LOG_WARN, "dns %s: resolution failed (%s); keeping %zu",
                        nm->host, sched_strerror(status), nm->n_ids);
        return;
    }
    if (n > DNS_MAX_ADDRS)
        n = DNS_MAX_ADDRS;
    ids = sched_calloc(n ? n : 1, sizeof(char *));
    if (!ids)
        return;
    for (size_t i = 0; i < n; i++) {
        sched_instance_desc_t d;
        char id[SCHED_ID_MAX], url[160], err[200];
        bool v6;
        addrs[i].ip[sizeof(addrs[i].ip) - 1] = '\0';
        v6 = strchr(addrs[i].ip, ':') != NULL;
        snprintf(id, sizeof(id), "%s@%s%.63s%s:%d", sched_role_name(nm->role), v6 ? "[" : "",
                 addrs[i].ip, v6 ? "]" : "", nm->port);
        if (ids_contain(ids, n_new, id))
            continue;
        snprintf(url, sizeof(url), "http://%s%.63s%s:%d", v6 ? "[" : "", addrs[i].ip, v6 ? "]" : "",
                 nm->port);
        sched_instance_desc_init(&d);
        d.id = id;
        d.url = url;
        d.role = nm->role;
        d.source = SCHED_SOURCE_DNS;
        status = sched_pool_upsert(st->pool, &d, err, sizeof(err));
        if (status != SCHED_OK) {
            sched_pool_logf(st->pool, SCHED_LOG_WARN, "dns %s: address %s rejected: %s", nm->host,
                            addrs[i].ip, err);
            continue;
        }
        ids[n_new] = sched_strdup(id);
        if (ids[n_new])
            n_new++;
    }
    for (size_t i = 0; i < nm->n_ids; i++) {
        if (!ids_contain(ids, n_new, nm->ids[i])) {
            sched_pool_logf(st->pool, SCHED_LOG_INFO, "dns %s: %s vanished, retiring", nm->host,
                            nm->ids[i]);
            sched_pool_retire(st->pool, nm->ids[i]);
        }
    }
    free_ids(nm->ids, nm->n_ids);
    nm->ids = ids;
    nm->n_ids = n_new;
}

static void *dns_thread(void *arg)
{
    dns_state_t *st = arg;

    pthread_mutex_lock(&st->mu);
    while (!st->stop) {
        struct timespec until;
        pthread_mutex_unlock(&st->mu);
        for (size_t i = 0; i < st->n_names; i++)
            resolve_name(st, &st->names[i]);
        pthread_mutex_lock(&st->mu);
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += (time_t)(st->interval_ms / 1000);
        until.tv_nsec += (long)(st->interval_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!st->stop && pthread_cond_timedwait(&st->cond, &st->mu, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

static bool dns_configured(const sched_config_t *cfg)
{
    return (cfg->dns.prefill && *cfg->dns.prefill) || (cfg->dns.decode && *cfg->dns.decode) ||
           (cfg->dns.both && *cfg->dns.both);
}

static sched_status_t dns_create(const sched_config_t *cfg, sched_pool_t *pool, void **state_out)
{
    const char *names[3] = {cfg->dns.prefill, cfg->dns.decode, cfg->dns.both};
    const sched_role_t roles[3] = {SCHED_ROLE_PREFILL, SCHED_ROLE_DECODE, SCHED_ROLE_BOTH};
    pthread_condattr_t ca;
    dns_state_t *st;

    st = sched_calloc(1, sizeof(*st));
    if (!st)
        return SCHED_ERR_NO_MEMORY;
    st->pool = pool;
    st->interval_ms = cfg->dns.interval_ms ? cfg->dns.interval_ms : 5000;
    st->resolve = cfg->dns.resolve ? cfg->dns.resolve : resolve_getaddrinfo;
    st->resolve_arg = cfg->dns.resolve_arg;
    for (int i = 0; i < 3; i++) {
        dns_name_t *nm = &st->names[st->n_names];
        if (!names[i] || !*names[i])
            continue;
        if (sched_split_hostport(names[i], nm->host, sizeof(nm->host), &nm->port) != SCHED_OK) {
            sched_pool_logf(pool, SCHED_LOG_ERROR, "discovery.dns.%s: bad host:port \"%s\"",
                            sched_role_name(roles[i]), names[i]);
            sched_free(st);
            return SCHED_ERR_INVALID;
        }
        nm->role = roles[i];
        st->n_names++;
    }
    pthread_mutex_init(&st->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&st->cond, &ca);
    pthread_condattr_destroy(&ca);
    *state_out = st;
    return SCHED_OK;
}

static sched_status_t dns_start(void *arg)
{
    dns_state_t *st = arg;

    if (pthread_create(&st->thread, NULL, dns_thread, st) != 0)
        return SCHED_ERR_IO;
    st->running = true;
    return SCHED_OK;
}

static void dns_destroy(void *arg)
{
    dns_state_t *st = arg;

    if (st->running) {
        pthread_mutex_lock(&st->mu);
        st->stop = true;
        pthread_cond_signal(&st->cond);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->thread, NULL);
    }
    for (size_t i = 0; i < st->n_names; i++)
        free_ids(st->names[i].ids, st->names[i].n_ids);
    pthread_cond_destroy(&st->cond);
    pthread_mutex_destroy(&st->mu);
    sched_free(st);
}

const sched_discovery_ops_t sched_discovery_dns_ops = {
    .name = "dns",
    .source = SCHED_SOURCE_DNS,
    .configured = dns_configured,
    .create = dns_create,
    .start = dns_start,
    .tick = NULL,
    .destroy = dns_destroy,
};
