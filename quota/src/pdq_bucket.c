/*
 * pdq_bucket.c - token bucket arithmetic (see pdq_bucket.h).
 */
#include <math.h>

#include "pdq_bucket.h"

static double cap_now(const pdq_bucket_t *b)
{
    return b->leased ? b->cap : b->local_cap;
}

static double rate_per_ns(const pdq_bucket_t *b)
{
    return cap_now(b) / b->period_ns;
}

void pdq_bucket_init(pdq_bucket_t *b, uint64_t budget, double period_s, double local_share,
                     uint64_t now)
{
    *b = (pdq_bucket_t){0};
    b->cap = (double)budget;
    b->local_cap = b->cap * (local_share > 0 && local_share <= 1 ? local_share : 1.0);
    b->period_ns = period_s * 1e9;
    b->level = b->local_cap;
    b->stamp = now;
    b->last_use = now;
}

void pdq_bucket_refill(pdq_bucket_t *b, uint64_t now)
{
    if (b->leased || now <= b->stamp) {
        if (!b->leased && now < b->stamp)
            b->stamp = now; /* a clock that went back: restart from here */
        return;
    }
    double lvl = b->level + (double)(now - b->stamp) * rate_per_ns(b);
    b->level = lvl > b->local_cap ? b->local_cap : lvl;
    b->stamp = now;
}

/* The fleet's level now, from the last sync plus its refill since (leased mode). */
static double fleet_now(const pdq_bucket_t *b, uint64_t now)
{
    double lvl = b->fleet_level;
    if (now > b->fleet_stamp)
        lvl += (double)(now - b->fleet_stamp) * (b->cap / b->period_ns);
    return lvl > b->cap ? b->cap : lvl;
}

uint64_t pdq_bucket_wait_ns(const pdq_bucket_t *b, double cost, uint64_t now)
{
    double need = cost < cap_now(b) ? cost : cap_now(b);
    double have = b->level;
    if (b->leased) {
        /* Run ahead of the lease by at most half a slice; beyond that wait for the fleet's
         * bucket to refill what is owed, and at least until the next sync. */
        double short_by = need - have - b->slice / 2;
        if (short_by <= 0)
            return 0;
        double f = fleet_now(b, now);
        short_by -= f > 0 ? f : 0;
        double ns = short_by > 0 ? ceil(short_by / rate_per_ns(b)) : 0;
        if (ns < (double)b->sync_ns)
            ns = (double)b->sync_ns;
        return ns >= 1.8e19 ? UINT64_MAX : (uint64_t)ns;
    }
    if (now > b->stamp)
        have += (double)(now - b->stamp) * rate_per_ns(b);
    if (have >= need)
        return 0;
    double ns = ceil((need - have) / rate_per_ns(b));
    return ns >= 1.8e19 ? UINT64_MAX : (uint64_t)ns;
}

void pdq_bucket_spend(pdq_bucket_t *b, double cost, uint64_t now)
{
    pdq_bucket_refill(b, now);
    b->level -= cost;
    if (!b->leased && b->level > b->local_cap)
        b->level = b->local_cap;
    b->last_use = now;
}

double pdq_bucket_remaining(const pdq_bucket_t *b, uint64_t now)
{
    double lvl = b->level;
    if (!b->leased) {
        if (now > b->stamp)
            lvl += (double)(now - b->stamp) * rate_per_ns(b);
        if (lvl > b->local_cap)
            lvl = b->local_cap;
    } else {
        double f = fleet_now(b, now);
        lvl += f > 0 ? f : 0;
        if (lvl > b->cap)
            lvl = b->cap;
    }
    return lvl > 0 ? floor(lvl) : 0;
}

uint64_t pdq_bucket_reset_ns(const pdq_bucket_t *b, uint64_t now)
{
    double lvl = b->level;
    double cap = cap_now(b);
    if (!b->leased) {
        if (now > b->stamp)
            lvl += (double)(now - b->stamp) * rate_per_ns(b);
    } else {
        double f = fleet_now(b, now);
        lvl += f;
    }
    if (lvl >= cap)
        return 0;
    return (uint64_t)ceil((cap - lvl) / rate_per_ns(b));
}

void pdq_bucket_set_leased(pdq_bucket_t *b, bool leased, uint64_t now)
{
    if (b->leased == leased)
        return;
    if (leased) {
        /* Tokens refilled locally were never taken from the fleet: drop them, keep debt. */
        b->level = b->level < 0 ? b->level : 0;
        b->fleet_level = 0;
        b->fleet_stamp = now;
        b->fleet_known = false;
    } else {
        /* The store is gone: this replica goes on with its share of what the fleet had left
         * at the last sync (all replicas together: about what was left), plus its own lease.
         * Never synced: the share of a full budget, as at start-up without a store. */
        double share = b->cap > 0 ? b->local_cap / b->cap : 1;
        double lvl = b->local_cap;
        if (b->fleet_known) {
            double f = fleet_now(b, now);
            lvl = (b->level > 0 ? b->level : 0) + (f > 0 ? f : 0) * share;
        }
        b->level = lvl > b->local_cap ? b->local_cap : lvl;
        b->stamp = now;
    }
    b->leased = leased;
}
