/*
 * pdgw_kvctl_opts.c - the protocol_options of the KV control service (forwarder.h
 * pdgw_fwd_kv_opts_parse): the reservation's (ReserveRequest) and the ProxyNotif listener's,
 * with their defaults and ranges, shared by every forwarder that opens the service.
 */
#include <pdgw/forwarder.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

static int is_ip_literal(const char *s)
{
    unsigned char buf[16];
    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

/* The address to bind when proxy_host is not configured: the pod's own address (Kubernetes
 * downward API, POD_IP), else the first non-loopback IPv4 address of the host's name, else
 * loopback. Runs once at start-up (may resolve a name). */
static void default_bind_host(char *out, size_t cap)
{
    const char *pod = getenv("POD_IP");
    char name[256];
    struct addrinfo hints, *res = NULL, *ai;
    if (pod != NULL && is_ip_literal(pod)) {
        snprintf(out, cap, "%s", pod);
        return;
    }
    snprintf(out, cap, "127.0.0.1");
    if (gethostname(name, sizeof(name)) != 0)
        return;
    name[sizeof(name) - 1] = '\0';
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(name, NULL, &hints, &res) != 0)
        return;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)ai->ai_addr;
        if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127)
            continue;
        inet_ntop(AF_INET, &sin->sin_addr, out, (socklen_t)cap);
        break;
    }
    freeaddrinfo(res);
}

/* The ProxyNotif listener's options (PDGW_FWD_KV_NOTIF_OPT_KEYS). */
static pdgw_fwd_status_t notif_opts_parse(const json_t *options, pdgw_fwd_kv_opts_t *o, char *err,
                                          size_t errlen)
{
    static const char *const fallback[] = {"fail", "decode", NULL};
    int fb = 0;
    if (pdgw_fwd_opt_str(options, "proxy_host", "", o->proxy_host, sizeof(o->proxy_host), err,
                         errlen) ||
        pdgw_fwd_opt_int(options, "proxy_port", 8500, 0, 65535, &o->proxy_port, err, errlen) ||
        pdgw_fwd_opt_int(options, "notif_timeout_ms", 30000, 1, 3600000, &o->notif_timeout_ms, err,
                         errlen) ||
        /* Off unless configured: LMCache's current proxy admits every request
         * (examples/disagg_prefill/disagg_proxy_server.py has no limit); its weighted
         * semaphore lives in the engine, where the pages are allocated
         * (lmcache/v1/storage_backend/storage_manager.py, WeightedSemaphore). */
        pdgw_fwd_opt_int(options, "admission_chunks", 0, 0, INT32_MAX, &o->admission_chunks, err,
                         errlen) ||
        pdgw_fwd_opt_bool(options, "notif_check_peer", 1, &o->notif_check_peer, err, errlen) ||
        pdgw_fwd_opt_enum(options, "notif_fallback", fallback, 0, &fb, err, errlen) ||
        pdgw_fwd_opt_bool(options, "skip_proxy_notification", 0, &o->skip_proxy_notification, err,
                          errlen) ||
        pdgw_fwd_opt_str(options, "notif_curve_secret_key_file", "", o->curve_secret_key_file,
                         sizeof(o->curve_secret_key_file), err, errlen) ||
        pdgw_fwd_opt_str(options, "notif_curve_client_keys_file", "", o->curve_client_keys_file,
                         sizeof(o->curve_client_keys_file), err, errlen) ||
        pdgw_fwd_opt_str(options, "notif_relay_peers", "", o->notif_relay_peers,
                         sizeof(o->notif_relay_peers), err, errlen) ||
        pdgw_fwd_opt_int(options, "notif_relay_port", 0, 0, 65535, &o->notif_relay_port, err,
                         errlen))
        return PDGW_FWD_ERR_CONFIG;
    if (o->notif_relay_peers[0] != '\0' && o->notif_relay_port == 0) {
        snprintf(err, errlen,
                 "protocol option notif_relay_peers needs notif_relay_port (the port every "
                 "replica listens on for the notices its peers hand over)");
        return PDGW_FWD_ERR_CONFIG;
    }
    o->notif_fallback_decode = fb == 1;
    if (o->curve_client_keys_file[0] != '\0' && o->curve_secret_key_file[0] == '\0') {
        snprintf(err, errlen,
                 "protocol option notif_curve_client_keys_file needs "
                 "notif_curve_secret_key_file (the listener must be a CURVE server)");
        return PDGW_FWD_ERR_CONFIG;
    }
    if (o->proxy_host[0] == '\0')
        default_bind_host(o->proxy_host, sizeof(o->proxy_host));
    else if (strcmp(o->proxy_host, "*") == 0)
        snprintf(o->proxy_host, sizeof(o->proxy_host), "0.0.0.0");
    return PDGW_FWD_OK;
}

pdgw_fwd_status_t pdgw_fwd_kv_opts_parse(const json_t *options, int reserve_default, int notif,
                                         pdgw_fwd_kv_opts_t *o, char *err, size_t errlen)
{
    static const char *const refusal[] = {"queue", "repick", NULL};
    int mode = 0;
    memset(o, 0, sizeof(*o));
    o->proxy = notif;
    if (pdgw_fwd_opt_bool(options, "reserve", reserve_default, &o->reserve, err, errlen) ||
        pdgw_fwd_opt_int(options, "chunk_tokens", 256, 1, 1 << 20, &o->chunk_tokens, err, errlen) ||
        pdgw_fwd_opt_int(options, "reserve_ttl_ms", 30000, 1, 3600000, &o->reserve_ttl_ms, err,
                         errlen) ||
        pdgw_fwd_opt_int(options, "reserve_timeout_ms", 1000, 1, 60000, &o->reserve_timeout_ms, err,
                         errlen) ||
        pdgw_fwd_opt_int(options, "reserve_retry_ms", 50, 1, 60000, &o->reserve_retry_ms, err,
                         errlen) ||
        pdgw_fwd_opt_enum(options, "reserve_on_refusal", refusal, 0, &mode, err, errlen))
        return PDGW_FWD_ERR_CONFIG;
    o->on_refusal = (pdgw_fwd_kv_refusal_t)mode;
    if (!notif)
        return PDGW_FWD_OK;
    return notif_opts_parse(options, o, err, errlen);
}
