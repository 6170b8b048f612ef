/* pdgw-sim: a vLLM-compatible engine simulator. Start-up in stages:
 * config → allocate → start (engine, KV, HTTP) → wait for SIGTERM/SIGINT →
 * stop in reverse. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "sim_int.h"

void sim_http_quiesce(void);
void sim_engine_release_all(void);

static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int main(int argc, char **argv)
{
    sigset_t set;
    int sig = 0, rc;

    rc = sim_config_parse(argc, argv, &sim_cfg);
    if (rc)
        return rc > 0 ? 0 : 2;
    raise_fd_limit();
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* every thread inherits the mask */

    if (sim_cfg.tokenizer != NULL) {
        char err[512];
        if (sim_hf_tokenizer_load(sim_cfg.tokenizer, err, sizeof(err)) != 0) {
            fprintf(stderr, "pdgw-sim: --tokenizer %s: %s\n", sim_cfg.tokenizer, err);
            return 2;
        }
    }
    if (sim_kvev_configure(sim_cfg.kv_events_config, sim_cfg.kv_events_layout))
        return 2;
    if (sim_record_init(sim_cfg.record_capacity))
        goto err_record;
    if (sim_engine_start())
        goto err_engine;
    if (sim_kv_start())
        goto err_kv;
    if (sim_bootstrap_start())
        goto err_boot;
    if (sim_http_start())
        goto err_http;
    printf("pdgw-sim: role=%s model=%s listening on %s:%d engine_id=%s\n",
           sim_role_name(sim_cfg.role), sim_cfg.model, sim_cfg.host, sim_cfg.port,
           sim_cfg.engine_id);
    fflush(stdout);

    sigwait(&set, &sig);
    fprintf(stderr, "pdgw-sim: signal %d, shutting down\n", sig);
    sim_http_quiesce();
    sim_bootstrap_stop();
    sim_kv_stop();
    sim_engine_stop();
    sim_http_stop();
    sim_engine_release_all();
    sim_record_fini();
    sim_kvev_stop();
    sim_hf_tokenizer_free();
    return 0;

err_http:
    sim_bootstrap_stop();
err_boot:
    sim_kv_stop();
err_kv:
    sim_engine_stop();
    sim_engine_release_all();
err_engine:
    sim_record_fini();
err_record:
    return 1;
}
