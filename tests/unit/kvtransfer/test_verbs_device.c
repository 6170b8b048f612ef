/*
 * Device, port and GID choice from a fake sysfs tree: a configured name wins,
 * otherwise the NIC on (or nearest to) the buffer's NUMA node; RoCE v2
 * IPv4-mapped GIDs are preferred. Also the
 * "[name][:port[:gid]]" device setting.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvt_verbs_int.h"

static char root[256];

static void put(const char *rel, const char *content)
{
    char path[512], dir[512], *slash;

    snprintf(path, sizeof(path), "%s/%s", root, rel);
    snprintf(dir, sizeof(dir), "%s", path);
    for (char *p = dir + strlen(root) + 1; (slash = strchr(p, '/')) != NULL; p = slash + 1) {
        *slash = '\0';
        mkdir(dir, 0755);
        *slash = '/';
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
}

static int setup(void **state)
{
    snprintf(root, sizeof(root), "/tmp/kvt-verbs-sysfs-XXXXXX");
    if (mkdtemp(root) == NULL)
        return -1;
    /* mlx5_0 on node 1, mlx5_1 on node 0, rxe0 with numa_node -1 (virtual),
     * mlx5_2 on node 3 */
    put("class/infiniband/mlx5_0/device/numa_node", "1\n");
    put("class/infiniband/mlx5_1/device/numa_node", "0\n");
    put("class/infiniband/rxe0/device/numa_node", "-1\n");
    put("class/infiniband/mlx5_2/device/numa_node", "3\n");
    put("devices/system/node/node0/distance", "10 21 31 41\n");
    put("devices/system/node/node1/distance", "21 10 21 31\n");
    put("devices/system/node/node2/distance", "31 21 10 12\n");
    put("devices/system/node/node3/distance", "41 31 12 10\n");
    /* GID table of rxe0 port 1: link-local v1, link-local v2, IPv4-mapped v2 */
    put("class/infiniband/rxe0/ports/1/gids/0", "fe80:0000:0000:0000:5054:00ff:fe12:3456\n");
    put("class/infiniband/rxe0/ports/1/gid_attrs/types/0", "IB/RoCE v1\n");
    put("class/infiniband/rxe0/ports/1/gids/1", "fe80:0000:0000:0000:5054:00ff:fe12:3456\n");
    put("class/infiniband/rxe0/ports/1/gid_attrs/types/1", "RoCE v2\n");
    put("class/infiniband/rxe0/ports/1/gids/2", "0000:0000:0000:0000:0000:ffff:0a00:0005\n");
    put("class/infiniband/rxe0/ports/1/gid_attrs/types/2", "RoCE v2\n");
    put("class/infiniband/rxe0/ports/1/gids/3", "0000:0000:0000:0000:0000:0000:0000:0000\n");
    put("class/infiniband/rxe0/ports/1/gid_attrs/types/3", "RoCE v2\n");
    /* IB port: no types, first non-zero GID */
    put("class/infiniband/mlx5_0/ports/1/gids/0", "0000:0000:0000:0000:0000:0000:0000:0000\n");
    put("class/infiniband/mlx5_0/ports/1/gids/1", "fe80:0000:0000:0000:0002:c903:0000:0001\n");
    /* RoCE v2 without IPv4-mapped address */
    put("class/infiniband/mlx5_1/ports/1/gids/0", "fe80:0000:0000:0000:0000:0000:0000:0001\n");
    put("class/infiniband/mlx5_1/ports/1/gid_attrs/types/0", "IB/RoCE v1\n");
    put("class/infiniband/mlx5_1/ports/1/gids/1", "fe80:0000:0000:0000:0000:0000:0000:0001\n");
    put("class/infiniband/mlx5_1/ports/1/gid_attrs/types/1", "RoCE v2\n");
    return 0;
}

static int teardown(void **state)
{
    char cmd[300];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *const names[] = {"rxe0", "mlx5_0", "mlx5_1", "mlx5_2"};

static void test_numa_read(void **state)
{
    assert_int_equal(kvt_verbs_dev_numa(root, "mlx5_0"), 1);
    assert_int_equal(kvt_verbs_dev_numa(root, "mlx5_1"), 0);
    assert_int_equal(kvt_verbs_dev_numa(root, "rxe0"), -1);
    assert_int_equal(kvt_verbs_dev_numa(root, "nope"), -1);
}

static void test_pick_same_node(void **state)
{
    size_t idx = 99;

    assert_int_equal(kvt_verbs_dev_pick(root, names, 4, NULL, 0, &idx), KVT_OK);
    assert_string_equal(names[idx], "mlx5_1");
    assert_int_equal(kvt_verbs_dev_pick(root, names, 4, "", 1, &idx), KVT_OK);
    assert_string_equal(names[idx], "mlx5_0");
    assert_int_equal(kvt_verbs_dev_pick(root, names, 4, NULL, 3, &idx), KVT_OK);
    assert_string_equal(names[idx], "mlx5_2");
}

static void test_pick_nearest_by_distance(void **state)
{
    size_t idx = 99;

    /* node 2 has no NIC: node 3 (12) is nearer than node 1 (21) */
    assert_int_equal(kvt_verbs_dev_pick(root, names, 4, NULL, 2, &idx), KVT_OK);
    assert_string_equal(names[idx], "mlx5_2");
    /* without mlx5_2, node 1 (21) beats node 0 (31) */
    assert_int_equal(kvt_verbs_dev_pick(root, names, 3, NULL, 2, &idx), KVT_OK);
    assert_string_equal(names[idx], "mlx5_0");
}

static void test_pick_unknown_numa_keeps_order(void **state)
{
    size_t idx = 99;

    assert_int_equal(kvt_verbs_dev_pick(root, names, 4, NULL, -1, &idx), KVT_OK);
    assert_int_equal(idx, 0);
    /* a device with an unknown node loses against one with a known node */
    assert_int_equal(kvt_verbs_dev_pick(root, names, 2, NULL, 0, &idx), KVT_OK);
    assert_string_equal(names[idx], "mlx5_0");
}

static void test_pick_configured(void **state)
{
    size_t idx = 99;

    assert_int_equal(kvt_verbs_dev_pick(root, names, 4, "mlx5_2", 0, &idx), KVT_OK);
    assert_int_equal(idx, 3);
    idx = 99;
    assert_int_equal(kvt_verbs_dev_pick(root, names, 4, "mlx5_9", 0, &idx), KVT_ERR_NOT_FOUND);
    assert_int_equal(idx, 99);
    assert_int_equal(kvt_verbs_dev_pick(root, names, 0, NULL, 0, &idx), KVT_ERR_NOT_FOUND);
}

static void test_gid_pick(void **state)
{
    assert_int_equal(kvt_verbs_gid_pick(root, "rxe0", 1, -1), 2);   /* IPv4-mapped RoCE v2 */
    assert_int_equal(kvt_verbs_gid_pick(root, "mlx5_1", 1, -1), 1); /* first RoCE v2 */
    assert_int_equal(kvt_verbs_gid_pick(root, "mlx5_0", 1, -1), 1); /* IB: first non-zero */
    assert_int_equal(kvt_verbs_gid_pick(root, "nope", 1, -1), 0);
    assert_int_equal(kvt_verbs_gid_pick(root, "rxe0", 1, 0), 0); /* configured */
    assert_int_equal(kvt_verbs_gid_pick(root, "rxe0", 1, 7), 7);
}

static void test_device_setting(void **state)
{
    kvt_verbs_cfg_t c;

    kvt_verbs_cfg_defaults(&c);
    assert_int_equal(c.qps_per_peer, 2);
    assert_int_equal(c.slice_size, 64 * 1024);
    assert_int_equal(c.gid_index, -1);
    assert_int_equal(kvt_verbs_cfg_parse_device("", &c), KVT_OK);
    assert_string_equal(c.device, "");
    assert_int_equal(c.port, 0);
    assert_int_equal(c.gid_index, -1);
    assert_int_equal(kvt_verbs_cfg_parse_device(NULL, &c), KVT_OK);
    assert_int_equal(kvt_verbs_cfg_parse_device("mlx5_0", &c), KVT_OK);
    assert_string_equal(c.device, "mlx5_0");
    assert_int_equal(kvt_verbs_cfg_parse_device("mlx5_0:2", &c), KVT_OK);
    assert_int_equal(c.port, 2);
    assert_int_equal(c.gid_index, -1);
    assert_int_equal(kvt_verbs_cfg_parse_device("rxe0:1:3", &c), KVT_OK);
    assert_string_equal(c.device, "rxe0");
    assert_int_equal(c.port, 1);
    assert_int_equal(c.gid_index, 3);
    assert_int_equal(kvt_verbs_cfg_parse_device("::3", &c), KVT_OK);
    assert_string_equal(c.device, "");
    assert_int_equal(c.port, 0);
    assert_int_equal(c.gid_index, 3);
    assert_int_equal(kvt_verbs_cfg_parse_device("mlx5_0:x", &c), KVT_ERR_CONFIG);
    assert_int_equal(kvt_verbs_cfg_parse_device("mlx5_0:1:2:3", &c), KVT_ERR_CONFIG);
    assert_int_equal(kvt_verbs_cfg_parse_device("mlx5_0:0", &c), KVT_ERR_CONFIG);
    assert_int_equal(kvt_verbs_cfg_parse_device("mlx5_0:1:256", &c), KVT_ERR_CONFIG);
    assert_int_equal(kvt_verbs_cfg_parse_device("mlx5_0:1:-1", &c), KVT_ERR_CONFIG);
}

static void test_numa_of_buffer(void **state)
{
    char *buf = malloc(1 << 20);
    int node;

    assert_non_null(buf);
    buf[0] = 1; /* fault the page in */
    node = kvt_verbs_numa_of(buf);
    /* this host's node count bounds the answer; -1 only where get_mempolicy is
     * refused */
    assert_true(node >= -1 && node < 4096);
    if (access("/sys/devices/system/node/node0", F_OK) == 0 && node >= 0) {
        char p[64];

        snprintf(p, sizeof(p), "/sys/devices/system/node/node%d", node);
        assert_int_equal(access(p, F_OK), 0);
    }
    assert_int_equal(kvt_verbs_numa_of(NULL), -1);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numa_read),
        cmocka_unit_test(test_pick_same_node),
        cmocka_unit_test(test_pick_nearest_by_distance),
        cmocka_unit_test(test_pick_unknown_numa_keeps_order),
        cmocka_unit_test(test_pick_configured),
        cmocka_unit_test(test_gid_pick),
        cmocka_unit_test(test_device_setting),
        cmocka_unit_test(test_numa_of_buffer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
