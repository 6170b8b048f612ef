/*
 * kvt_tsan.h -- ordering that travels through the kernel, made visible to
 * ThreadSanitizer.
 *
 * A TCP serve thread reads a pool page to send it to a peer, or writes one
 * with what a peer sent. The engine touches that page again only after the
 * peer said so on another socket (the landed echo, a notification, a lookup
 * answer), so the accesses are ordered, but through two ends of a loopback
 * connection: TSan sees no edge there and would report every reuse of a
 * served page as a race. The serve thread releases after each served
 * payload; the pool accessors acquire before touching a page. Outside a TSan
 * build both compile to nothing.
 */
#ifndef KVT_TSAN_H
#define KVT_TSAN_H

#include <stddef.h>
#include <zmq.h>

#if defined(__SANITIZE_THREAD__)
#define KVT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVT_TSAN 1
#endif
#endif

#ifdef KVT_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
extern char kvt_tsan_wire; /* the sync object: defined in kvt_pool_mem.c */
#define KVT_TSAN_WIRE_RELEASE() __tsan_release(&kvt_tsan_wire)
#define KVT_TSAN_WIRE_ACQUIRE() __tsan_acquire(&kvt_tsan_wire)
#else
#define KVT_TSAN_WIRE_RELEASE() ((void)0)
#define KVT_TSAN_WIRE_ACQUIRE() ((void)0)
#endif

/* ZeroMQ orders a message's send before its receipt, through pipes and sockets TSan does not
 * see into: one engine reuses a page only after the other said over ZeroMQ that it is done
 * with it (and the other reads a page only after being told over ZeroMQ that it is filled).
 * Every send releases and every receipt acquires the same sync object. */
static inline int kvt_zmq_send(void *sock, const void *buf, size_t len, int flags)
{
    KVT_TSAN_WIRE_RELEASE();
    return zmq_send(sock, buf, len, flags);
}

static inline int kvt_zmq_msg_recv(zmq_msg_t *msg, void *sock, int flags)
{
    int n = zmq_msg_recv(msg, sock, flags);
    if (n >= 0)
        KVT_TSAN_WIRE_ACQUIRE();
    return n;
}

#endif
