/*
 * kvt_transport.c - registry of data transports (name -> ops table).
 * Transports register themselves with KVT_TRANSPORT_REGISTER(); the link
 * hooks below keep their objects in a static link.
 */
#include <pthread.h>
#include <string.h>

#include "kvt_transport.h"

#define KVT_TRANSPORT_MAX 8

void kvt_tl_tcp_link(void);
#ifdef KVT_WITH_VERBS
void kvt_tl_verbs_link(void);
#endif

static const kvt_transport_desc_t *g_transports[KVT_TRANSPORT_MAX];
static size_t g_ntransports;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

kvt_status_t kvt_transport_register(const kvt_transport_desc_t *desc)
{
    kvt_status_t st = KVT_OK;

    if (desc == NULL || desc->name == NULL || desc->ops == NULL)
        return KVT_ERR_INVALID;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_ntransports; i++) {
        if (strcmp(g_transports[i]->name, desc->name) == 0) {
            st = KVT_ERR_EXISTS;
            goto out;
        }
    }
    if (g_ntransports == KVT_TRANSPORT_MAX) {
        st = KVT_ERR_NOSPACE;
        goto out;
    }
    g_transports[g_ntransports++] = desc;
out:
    pthread_mutex_unlock(&g_lock);
    return st;
}

static void link_all(void)
{
    kvt_tl_tcp_link();
#ifdef KVT_WITH_VERBS
    kvt_tl_verbs_link();
#endif
}

const kvt_transport_desc_t *kvt_transport_find(const char *name)
{
    const kvt_transport_desc_t *d = NULL;

    link_all();
    if (name == NULL)
        return NULL;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_ntransports; i++) {
        if (strcmp(g_transports[i]->name, name) == 0)
            d = g_transports[i];
    }
    pthread_mutex_unlock(&g_lock);
    return d;
}

size_t kvt_transport_list(const kvt_transport_desc_t **out, size_t max)
{
    size_t n;

    link_all();
    pthread_mutex_lock(&g_lock);
    n = g_ntransports;
    for (size_t i = 0; i < n && i < max && out != NULL; i++)
        out[i] = g_transports[i];
    pthread_mutex_unlock(&g_lock);
    return n;
}
