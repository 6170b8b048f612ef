/*
 * pdgw_kvctl_notif.c - ProxyNotif counting of the KV control service (service thread): a
 * notice counts only for an attempt in flight, only from that attempt's prefill addresses
 * (zmq Peer-Address against the prefill's host and kv_host, names resolved here and cached)
 * and at most once per TP rank; a notice for an attempt that already ended releases a
 * transfer that landed late (CancelNotif), one for an unknown request goes to the relay.
 */
#include "pdgw_kvctl.h"

#include <stdio.h>
#include <string.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

/* Binary form of an IP address text (16 bytes; IPv4 and IPv4-mapped IPv6 as ::ffff:a.b.c.d),
 * 0 when it is not an address. */
static int addr_parse(const char *s, unsigned char out[16])
{
    struct in_addr a4;
    memset(out, 0, 16);
    if (inet_pton(AF_INET, s, &a4) == 1) {
        out[10] = out[11] = 0xff;
        memcpy(out + 12, &a4, 4);
        return 1;
    }
    return inet_pton(AF_INET6, s, out) == 1;
}

/* The addresses of <host> (an IP literal, or a name resolved on this thread and cached). */
static int host_addrs(pdgw_fwd_kv_svc_t *kv, const char *host, unsigned char (*out)[16], int max)
{
    struct addrinfo hints, *res = NULL, *ai;
    kvctl_dns_t *slot = &kv->dns[0];
    int64_t now = pdgw_kvctl_now_ms(kv);
    int n = 0;
    if (host[0] == '\0')
        return 0;
    if (addr_parse(host, out[0]))
        return 1;
    for (int i = 0; i < KVCTL_DNS_SLOTS; i++) {
        kvctl_dns_t *d = &kv->dns[i];
        if (d->host[0] != '\0' && strcmp(d->host, host) == 0 && now - d->t_ms < KVCTL_DNS_TTL_MS) {
            memcpy(out, d->addr, sizeof(d->addr[0]) * (size_t)(d->n < max ? d->n : max));
            return d->n < max ? d->n : max;
        }
        if (d->t_ms < slot->t_ms)
            slot = d; /* the oldest entry is replaced */
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) == 0) {
        for (ai = res; ai != NULL && n < KVCTL_ADDRS; ai = ai->ai_next) {
            char txt[INET6_ADDRSTRLEN];
            const void *a = ai->ai_family == AF_INET
                                ? (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr
                                : (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
            if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) &&
                inet_ntop(ai->ai_family, a, txt, sizeof(txt)) && addr_parse(txt, slot->addr[n]))
                n++;
        }
        freeaddrinfo(res);
    }
    snprintf(slot->host, sizeof(slot->host), "%.*s", KVCTL_HOST_MAX - 1, host);
    slot->n = n;
    slot->t_ms = now;
    memcpy(out, slot->addr, sizeof(slot->addr[0]) * (size_t)(n < max ? n : max));
    return n < max ? n : max;
}

/* Whether <peer> (the sender's address) is one of the prefill's addresses. With no address
 * known on either side the sender cannot be told: accepted. */
static int peer_is_prefill(pdgw_fwd_kv_svc_t *kv, const char phost[2][KVCTL_HOST_MAX],
                           const char *peer)
{
    unsigned char p[16], a[KVCTL_ADDRS][16];
    int known = 0;
    if (!kv->o.notif_check_peer)
        return 1;
    if (peer[0] == '\0' || !addr_parse(peer, p))
        return phost[0][0] == '\0' && phost[1][0] == '\0';
    for (int h = 0; h < 2; h++) {
        int n = host_addrs(kv, phost[h], a, KVCTL_ADDRS);
        known += phost[h][0] != '\0';
        for (int i = 0; i < n; i++)
            if (memcmp(a[i], p, 16) == 0)
                return 1;
    }
    return !known;
}

/* One ProxyNotif from <peer>: returns NULL when it counted, else the reason it was ignored.
 * The sender check may resolve a host name, so it runs without the lock. */
static const char *on_notif(pdgw_fwd_kv_svc_t *kv, const char *id, const char *peer,
                            int *late_release)
{
    char phost[2][KVCTL_HOST_MAX];
    pdgw_fwd_kv_req_t *q;
    kvctl_tomb_t *t;
    int ok;
    pthread_mutex_lock(&kv->lock);
    q = pdgw_kvctl_waiter_find_locked(kv, id);
    t = q ? NULL : pdgw_kvctl_tomb_find_locked(kv, id);
    if (q == NULL && t == NULL) {
        pthread_mutex_unlock(&kv->lock);
        return "unknown"; /* no such request in flight: forged, guessed, or another gateway's */
    }
    memcpy(phost, q ? q->phost : t->phost, sizeof(phost));
    pthread_mutex_unlock(&kv->lock);

    ok = peer_is_prefill(kv, (const char(*)[KVCTL_HOST_MAX])phost, peer);
    pthread_mutex_lock(&kv->lock);
    if (!ok) {
        pthread_mutex_unlock(&kv->lock);
        return "peer";
    }
    if ((q = pdgw_kvctl_waiter_find_locked(kv, id)) != NULL) {
        const char *why = NULL;
        if (q->notif_got >= q->notif_need)
            why = "surplus"; /* more than one per TP rank: a replay */
        else if (++q->notif_got >= q->notif_need)
            pdgw_kvctl_wake_locked(q);
        pdgw_kvctl_unlock(kv);
        return why;
    }
    if ((t = pdgw_kvctl_tomb_find_locked(kv, id)) != NULL && t->has_dest) {
        /* The transfer of an attempt that already ended landed after all: release it. */
        *late_release = pdgw_kvctl_push_cancel_locked(kv, &t->dest, id, 1);
    }
    pthread_mutex_unlock(&kv->lock);
    return "late";
}

/* One notice, direct from an engine or <relayed> by a peer replica. */
static void take_notif(pdgw_fwd_kv_svc_t *kv, const char *id, const char *peer, int relayed)
{
    int late_release = 0;
    const char *why = on_notif(kv, id, peer, &late_release);
    if (why == NULL) {
        pdgw_kvctl_count(kv, "proxy_notifs", "ProxyNotif messages accepted.");
        return;
    }
    if (kv->relay != NULL && !relayed && strcmp(why, "unknown") == 0) {
        /* Another replica's request, most likely: never relayed twice. */
        pdgw_notif_relay_forward(kv->relay, id, peer);
        return;
    }
    pdgw_notif_count_rejected(kv->protocol, why);
    pdgw_fwd_log(PDGW_FWD_LOG_DEBUG, "%s: ProxyNotif{req_id=%.64s} from %s%s ignored: %s",
                 kv->protocol, id, peer[0] ? peer : "?", relayed ? " (relayed)" : "", why);
    if (late_release)
        pdgw_kvctl_count(
            kv, "late_kv_releases",
            "CancelNotifs re-sent for transfers that landed after their request ended.");
}

void pdgw_kvctl_drain_notifs(pdgw_fwd_kv_svc_t *kv)
{
    char id[KVCTL_ID_MAX], peer[INET6_ADDRSTRLEN + 8];
    while (kv->notif && pdgw_notif_recv(kv->notif, id, sizeof(id), peer, sizeof(peer)) == 1)
        take_notif(kv, id, peer, 0);
    while (kv->relay && pdgw_notif_relay_recv(kv->relay, id, sizeof(id), peer, sizeof(peer)) == 1)
        take_notif(kv, id, peer, 1);
}
