/* test_sdnotify.c — systemd notifications (ie_sdnotify.h) against a real
 * notify socket: an AF_UNIX datagram socket in a fresh temporary directory
 * stands in for systemd, $NOTIFY_SOCKET points at it, and every call's
 * datagram is read back and compared.
 */
#define _GNU_SOURCE
#include "ie_sdnotify.h"

#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

static char g_dir[64];
static char g_path[96]; /* fits sun_path (108) */
static int g_fd = -1;

static int suite_init(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/ie_sdnotify_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_path, sizeof g_path, "%s/notify", g_dir);
    g_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (g_fd < 0) return -1;
    struct sockaddr_un sa = {0};
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, g_path, strlen(g_path) + 1);
    if (bind(g_fd, (struct sockaddr *)&sa, sizeof sa) != 0) return -1;
    struct timeval tv = {2, 0}; /* a missing datagram fails the test, not hangs it */
    setsockopt(g_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return 0;
}

static int suite_clean(void)
{
    if (g_fd >= 0) close(g_fd);
    unlink(g_path);
    rmdir(g_dir);
    unsetenv("NOTIFY_SOCKET");
    return 0;
}

/* The next datagram as a string ("" on timeout). */
static const char *next_datagram(void)
{
    static char buf[4096];
    ssize_t n = recv(g_fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    return buf;
}

/* Nothing is waiting on the socket. */
static int socket_empty(void)
{
    char c;
    return recv(g_fd, &c, 1, MSG_DONTWAIT) < 0;
}

static void test_messages(void)
{
    CU_ASSERT_EQUAL_FATAL(setenv("NOTIFY_SOCKET", g_path, 1), 0);

    CU_ASSERT(ie_sd_ready("loaded") > 0);
    CU_ASSERT_STRING_EQUAL(next_datagram(), "READY=1\nSTATUS=loaded");
    CU_ASSERT(ie_sd_ready(NULL) > 0);
    CU_ASSERT_STRING_EQUAL(next_datagram(), "READY=1");

    CU_ASSERT(ie_sd_status("serving %d workers, %s", 2, "kv 12%") > 0);
    CU_ASSERT_STRING_EQUAL(next_datagram(), "STATUS=serving 2 workers, kv 12%");
    /* a newline would start a new assignment: it is flattened */
    CU_ASSERT(ie_sd_status("line one\nWATCHDOG=trigger") > 0);
    CU_ASSERT_STRING_EQUAL(next_datagram(), "STATUS=line one WATCHDOG=trigger");
    CU_ASSERT(ie_sd_ready("a\nb") > 0);
    CU_ASSERT_STRING_EQUAL(next_datagram(), "READY=1\nSTATUS=a b");

    CU_ASSERT(ie_sd_watchdog() > 0);
    CU_ASSERT_STRING_EQUAL(next_datagram(), "WATCHDOG=1");
    CU_ASSERT(ie_sd_stopping() > 0);
    CU_ASSERT_STRING_EQUAL(next_datagram(), "STOPPING=1");
    CU_ASSERT(socket_empty());

    /* the environment stays: a later call still reaches the socket */
    CU_ASSERT_STRING_EQUAL(getenv("NOTIFY_SOCKET"), g_path);
    CU_ASSERT(ie_sd_watchdog() > 0);
    CU_ASSERT_STRING_EQUAL(next_datagram(), "WATCHDOG=1");
}

static void test_no_socket(void)
{
    unsetenv("NOTIFY_SOCKET");
    CU_ASSERT_EQUAL(ie_sd_ready("loaded"), 0);
    CU_ASSERT_EQUAL(ie_sd_status("x %d", 1), 0);
    CU_ASSERT_EQUAL(ie_sd_watchdog(), 0);
    CU_ASSERT_EQUAL(ie_sd_stopping(), 0);
    CU_ASSERT(socket_empty());
}

static void test_dead_socket(void)
{
    /* a socket path nobody listens on: an error, not a crash */
    char path[160];
    snprintf(path, sizeof path, "%s/nobody", g_dir);
    CU_ASSERT_EQUAL_FATAL(setenv("NOTIFY_SOCKET", path, 1), 0);
    CU_ASSERT(ie_sd_watchdog() < 0);
    CU_ASSERT(ie_sd_ready("x") < 0);
    unsetenv("NOTIFY_SOCKET");
}

static void test_watchdog_usec(void)
{
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());

    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    CU_ASSERT_EQUAL(ie_sd_watchdog_usec(), 0);

    setenv("WATCHDOG_USEC", "30000000", 1);
    setenv("WATCHDOG_PID", pid, 1);
    CU_ASSERT_EQUAL(ie_sd_watchdog_usec(), 30000000u);
    /* without WATCHDOG_PID the interval is for whoever reads it */
    unsetenv("WATCHDOG_PID");
    CU_ASSERT_EQUAL(ie_sd_watchdog_usec(), 30000000u);
    /* meant for another process */
    snprintf(pid, sizeof pid, "%d", (int)getpid() + 1);
    setenv("WATCHDOG_PID", pid, 1);
    CU_ASSERT_EQUAL(ie_sd_watchdog_usec(), 0);
    /* malformed */
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    setenv("WATCHDOG_USEC", "soon", 1);
    CU_ASSERT_EQUAL(ie_sd_watchdog_usec(), 0);
    setenv("WATCHDOG_USEC", "0", 1);
    CU_ASSERT_EQUAL(ie_sd_watchdog_usec(), 0);
    /* still there afterwards (not consumed) */
    setenv("WATCHDOG_USEC", "5000000", 1);
    CU_ASSERT_EQUAL(ie_sd_watchdog_usec(), 5000000u);
    CU_ASSERT_PTR_NOT_NULL(getenv("WATCHDOG_USEC"));
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("sdnotify", suite_init, suite_clean);
    CU_add_test(s, "READY/STATUS/WATCHDOG/STOPPING on a real socket", test_messages);
    CU_add_test(s, "no NOTIFY_SOCKET: 0", test_no_socket);
    CU_add_test(s, "socket nobody listens on: <0", test_dead_socket);
    CU_add_test(s, "WATCHDOG_USEC / WATCHDOG_PID", test_watchdog_usec);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
