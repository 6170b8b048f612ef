/*
 * fwd_pd_stash.c - keeps a prefill's kv_transfer_params across the attempts of one request,
 * so a decode-only retry (pdgw_fwd_request_t.reuse_prefill) hands the same params to a new
 * decode instead of running the prefill again. Keyed by request id; bounded in size and age;
 * thread-safe (attempts of one request run on one worker, different requests on many).
 */
#include "fwd_pd.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define STASH_MAX    4096
#define STASH_MAX_MS 600000 /* 10 min: beyond any engine's hold timeout */

typedef struct stash_ent {
    struct stash_ent *next;
    char *id;
    json_t *kvp;
    int64_t t_ms;
} stash_ent_t;

struct fwd_pd_stash {
    pthread_mutex_t lock;
    stash_ent_t *head; /* newest first */
    size_t n;
};

fwd_pd_stash_t *fwd_pd_stash_create(void)
{
    fwd_pd_stash_t *s = calloc(1, sizeof(*s));
    if (s != NULL)
        pthread_mutex_init(&s->lock, NULL);
    return s;
}

static void ent_free(stash_ent_t *e)
{
    json_decref(e->kvp);
    free(e->id);
    free(e);
}

void fwd_pd_stash_destroy(fwd_pd_stash_t *s)
{
    if (s == NULL)
        return;
    while (s->head) {
        stash_ent_t *e = s->head;
        s->head = e->next;
        ent_free(e);
    }
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void fwd_pd_stash_put(fwd_pd_stash_t *s, const char *request_id, json_t *kvp, int64_t t_ms)
{
    stash_ent_t *e, **pp;
    size_t i = 0;
    if (s == NULL || request_id == NULL || kvp == NULL) {
        json_decref(kvp);
        return;
    }
    e = calloc(1, sizeof(*e));
    if (e == NULL || (e->id = strdup(request_id)) == NULL) {
        free(e);
        json_decref(kvp);
        return;
    }
    e->kvp = kvp;
    e->t_ms = t_ms;
    pthread_mutex_lock(&s->lock);
    e->next = s->head;
    s->head = e;
    s->n++;
    /* drop what is too old or beyond the bound (the list is newest first) */
    for (pp = &s->head; *pp != NULL;) {
        stash_ent_t *x = *pp;
        if (i >= STASH_MAX || t_ms - x->t_ms > STASH_MAX_MS) {
            *pp = x->next;
            s->n--;
            ent_free(x);
        } else {
            pp = &x->next;
            i++;
        }
    }
    pthread_mutex_unlock(&s->lock);
}

json_t *fwd_pd_stash_take(fwd_pd_stash_t *s, const char *request_id, int64_t *t_ms)
{
    stash_ent_t **pp;
    json_t *kvp = NULL;
    if (s == NULL || request_id == NULL)
        return NULL;
    pthread_mutex_lock(&s->lock);
    for (pp = &s->head; *pp != NULL; pp = &(*pp)->next) {
        stash_ent_t *e = *pp;
        if (strcmp(e->id, request_id) == 0) {
            *pp = e->next;
            s->n--;
            kvp = e->kvp;
            e->kvp = NULL;
            if (t_ms != NULL)
                *t_ms = e->t_ms;
            ent_free(e);
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return kvp;
}
