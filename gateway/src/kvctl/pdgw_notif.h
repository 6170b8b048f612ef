/*
 * pdgw_notif.h - the sockets of the KV control service (pdgw_kvctl.c): the checked
 * ProxyNotif listener (pdgw_notif.c) and the relay between gateway replicas
 * (pdgw_notif_relay.c). Both are driven by the service's thread only.
 */
#ifndef PDGW_NOTIF_H
#define PDGW_NOTIF_H

#include <pdgw/forwarder.h>
#include <stddef.h>

/* ---- ProxyNotif listener (pdgw_notif.c) ---- */

typedef struct pdgw_notif pdgw_notif_t;
/* Bind the PULL at o->proxy_host:o->proxy_port (CURVE server when a secret key file is
 * configured; only listed client keys when a client key file is). */
pdgw_fwd_status_t pdgw_notif_create(const char *protocol, const pdgw_fwd_kv_opts_t *o,
                                    pdgw_notif_t **out, char *err, size_t errlen);
void pdgw_notif_destroy(pdgw_notif_t *n);
int pdgw_notif_port(const pdgw_notif_t *n);
/* The fds to poll (ZMQ_FD, edge-style: call pdgw_notif_recv until it returns 0). */
size_t pdgw_notif_fds(const pdgw_notif_t *n, int fds[2]);
/* One ProxyNotif: 1 with its req_id and the sender's IP address (zmq Peer-Address, "" when
 * unknown), 0 when nothing is queued. Malformed messages are counted and skipped. */
int pdgw_notif_recv(pdgw_notif_t *n, char *id, size_t cap, char *peer, size_t peercap);
/* pdgw_fwd_proxy_notifs_rejected_total{protocol, reason}. */
void pdgw_notif_count_rejected(const char *protocol, const char *reason);

/* ---- ProxyNotif relay between gateway replicas (pdgw_notif_relay.c) ---- */

typedef struct pdgw_notif_relay pdgw_notif_relay_t;
/* Bind the relay PULL on proxy_host:notif_relay_port and connect to notif_relay_peers. */
pdgw_fwd_status_t pdgw_notif_relay_create(const char *protocol, const pdgw_fwd_kv_opts_t *o,
                                          pdgw_notif_relay_t **out, char *err, size_t errlen);
void pdgw_notif_relay_destroy(pdgw_notif_relay_t *r);
int pdgw_notif_relay_port(const pdgw_notif_relay_t *r);
/* The fd to poll (ZMQ_FD, edge-style: call pdgw_notif_relay_recv until it returns 0). */
int pdgw_notif_relay_fd(const pdgw_notif_relay_t *r);
/* Hand a notice nobody here waits for to every peer, with the engine address it came from. */
void pdgw_notif_relay_forward(pdgw_notif_relay_t *r, const char *id, const char *sender);
/* The next notice a peer handed over: 1 with its req_id and the engine's address, 0 when none
 * is queued. Messages from addresses that are not peers are dropped and counted. */
int pdgw_notif_relay_recv(pdgw_notif_relay_t *r, char *id, size_t cap, char *sender,
                          size_t sendercap);

#endif /* PDGW_NOTIF_H */
