/* worker_main.c — `ie-worker`: one worker process of the distributed
 * service (docs/OPERATIONS.md). It registers with the coordinator, loads
 * the shard it is assigned from its local model file, and serves steps.
 *
 *   ie-worker --model PATH --coordinator tcp://HOST:5555 [options]
 *   ie-worker --config /etc/clocher/worker.conf --numa-node 0
 *
 * Exit codes: 0 stopped (signal or the coordinator's BYE), 2 bad usage,
 * 3 model unreadable, 1 other failures.
 */
#include "ie_cli.h"
#include "ie_cpulat.h"
#include "ie_metrics.h"
#include "ie_node.h"
#include "ie_transport.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;

static void usage(FILE *f)
{
    fputs("usage: ie-worker --model PATH --coordinator ENDPOINT [options]\n"
          "  --config FILE            key = value lines (flags without --); flags win\n"
          "  --model PATH             the model on this host's disk (GGUF, IEBIN or HF dir)\n"
          "  --coordinator EP         coordinator's worker endpoint (tcp://host:5555, ipc://...)\n"
          "  --peer-bind EP           where other workers reach this one (tcp://127.0.0.1:0; tcp://0.0.0.0:0 with "
          "--advertise across hosts)\n"
          "  --advertise HOST         host name/address peers use for a tcp peer endpoint\n"
          "  --rank N                 ask for this rank (default: any free one)\n"
          "  --lora-dir DIR           read LoRA adapters from DIR/<name of the coordinator's path>\n"
          "  --threads N              compute threads (1)\n"
          "  --numa-node N            bind to this NUMA node (default: NUMA_POLICY)\n"
          "  --numa-policy P          auto|compact|scatter|socket:<id>|none\n"
          "  --affinity LIST          CPUs for the compute threads: auto|none|0-3,8\n"
          "  --no-pin                 do not pin compute threads\n"
          "  --metrics-port N         serve Prometheus /metrics on this port (0: off)\n"
          "  --metrics-addr A         address for /metrics (127.0.0.1)\n"
          "  --keys-dir DIR --key NAME   CURVE: this worker's key pair DIR/NAME.pub/.key\n"
          "  --coordinator-key FILE   CURVE: the coordinator's public key file\n"
          "  --authorized DIR         CURVE: the other workers' keys (DIR/workers/*.pub or DIR/*.pub)\n"
          "  --cpu-latency-us N       hold a PM QoS request: CPUs wake within N us (0: idle CPUs poll;\n"
          "                           needs /dev/cpu_dma_latency; env IE_CPU_LATENCY_US; docs/OPERATIONS.md)\n"
          "  --verbose\n",
          f);
}

int main(int argc, char **argv)
{
    int rc = 0, c;
    char err[512];
    int ac = 0;
    char **av = NULL;
    ie_node_opts_t o;
    ie_node_opts_default(&o);
    const char *keys_dir = NULL, *key_name = NULL, *coord_key_file = NULL, *authorized = NULL;
    const char *metrics_addr = "127.0.0.1", *advertise = NULL;
    const char *cpulat = NULL;
    long metrics_port = 0, lv;
    char coord_key[41] = "";
    ie_net_t *net = NULL;
    ie_metrics_t *metrics = NULL;
    ie_metrics_server_t *msrv = NULL;
    ie_status_t st;

    if (ie_cli_config_expand(argc, argv, &ac, &av, err, sizeof err) != 0) {
        return ie_cli_fail(IE_EXIT_USAGE, "%s", err);
    }
    enum { O_COORD = 1, O_PEER, O_ADV, O_RANK, O_NODE, O_POLICY, O_AFF, O_CKEY, O_LORADIR, O_HELP };
    static const struct option lo[] = {{"coordinator", required_argument, 0, O_COORD},
                                       {"peer-bind", required_argument, 0, O_PEER},
                                       {"advertise", required_argument, 0, O_ADV},
                                       {"rank", required_argument, 0, O_RANK},
                                       {"numa-node", required_argument, 0, O_NODE},
                                       {"numa-policy", required_argument, 0, O_POLICY},
                                       {"affinity", required_argument, 0, O_AFF},
                                       {"coordinator-key", required_argument, 0, O_CKEY},
                                       {"lora-dir", required_argument, 0, O_LORADIR},
                                       {"help", no_argument, 0, O_HELP},
                                       {0, 0, 0, 0}};
    long threads = o.n_threads;
    const ie_cli_pick_t picks[] = {IE_CLI_PICK(IE_FLAG_MODEL, &o.model_path),
                                   IE_CLI_PICK(IE_FLAG_THREADS, &threads),
                                   IE_CLI_PICK(IE_FLAG_NO_PIN, &o.pin_threads),
                                   IE_CLI_PICK(IE_FLAG_METRICS_PORT, &metrics_port),
                                   IE_CLI_PICK(IE_FLAG_METRICS_ADDR, &metrics_addr),
                                   IE_CLI_PICK(IE_FLAG_KEYS_DIR, &keys_dir),
                                   IE_CLI_PICK(IE_FLAG_KEY, &key_name),
                                   IE_CLI_PICK(IE_FLAG_AUTHORIZED, &authorized),
                                   IE_CLI_PICK(IE_FLAG_VERBOSE, &o.verbose),
                                   IE_CLI_PICK(IE_FLAG_CPU_LATENCY, &cpulat)};
    ie_cli_parser_t fl;
    ie_cli_parser_init(&fl, ac, av, picks, IE_CLI_NPICKS(picks), lo);
    while ((c = ie_cli_next(&fl)) != -1) {
        int bad = 0;
        switch (c) {
        case IE_CLI_ENGINE: o.n_threads = (int)threads; break;
        case IE_CLI_BAD: bad = 1; break;
        case O_COORD: o.coordinator = optarg; break;
        case O_PEER: o.peer_bind = optarg; break;
        case O_ADV: advertise = optarg; break;
        case O_RANK:
            bad = ie_cli_parse_long(optarg, 0, 63, &lv);
            o.rank = (int)lv;
            break;
        case O_NODE:
            bad = ie_cli_parse_long(optarg, 0, 4095, &lv);
            o.numa_node = (int)lv;
            break;
        case O_POLICY: o.numa_policy = optarg; break;
        case O_AFF: o.affinity = optarg; break;
        case O_CKEY: coord_key_file = optarg; break;
        case O_LORADIR: o.lora_dir = optarg; break;
        case O_HELP: usage(stdout); goto cleanup;
        default:
            rc = ie_cli_fail(IE_EXIT_USAGE, "unknown or incomplete option '%s' (see --help)", av[optind - 1]);
            goto cleanup;
        }
        if (bad) {
            rc = ie_cli_fail(IE_EXIT_USAGE, "bad value '%s' for %s", optarg, av[optind - 2 >= 0 ? optind - 2 : 0]);
            goto cleanup;
        }
    }
    if (optind < ac || !o.model_path || !o.coordinator) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "--model and --coordinator are required (see --help)");
        goto cleanup;
    }
    if (!!keys_dir != !!key_name || (keys_dir && !coord_key_file)) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "CURVE needs --keys-dir, --key and --coordinator-key together");
        goto cleanup;
    }
    if (ie_cpulat_apply(cpulat, "ie-worker") != IE_OK) {
        rc = ie_cli_fail(IE_EXIT_USAGE, "%s", ie_error_last());
        goto cleanup;
    }
    o.advertise = advertise; /* a tcp peer endpoint bound to all interfaces is advertised by name */
    if ((st = ie_net_new(&net)) != IE_OK) goto fail;
    if (keys_dir) {
        if ((st = ie_net_curve_from_dir(net, keys_dir, key_name, authorized)) != IE_OK) goto fail;
        if ((st = ie_keys_load(coord_key_file, coord_key)) != IE_OK) goto fail;
        o.coordinator_key = coord_key;
    }
    o.net = net;
    if (metrics_port > 0) {
        if ((st = ie_metrics_new(&metrics)) != IE_OK) goto fail;
        if ((st = ie_metrics_serve(metrics, metrics_addr, (int)metrics_port, &msrv)) != IE_OK) goto fail;
        o.metrics = metrics;
    }
    ie_cli_stop_on_signals(&g_stop);
    o.stop = &g_stop;
    st = ie_node_run(&o);
    if (st != IE_OK)
        rc = st == IE_ERR_IO || st == IE_ERR_FORMAT || st == IE_ERR_UNSUPPORTED ? IE_EXIT_MODEL : IE_EXIT_RUNTIME;
    goto cleanup;
fail:
    rc = ie_cli_fail(st == IE_ERR_INVAL ? IE_EXIT_USAGE : IE_EXIT_RUNTIME, "%s", ie_error_last());
cleanup:
    ie_metrics_server_stop(&msrv);
    ie_metrics_destroy(&metrics);
    ie_net_destroy(&net);
    ie_cli_config_free(ac, av);
    return rc;
}
