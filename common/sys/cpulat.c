/* cpulat.c — the PM QoS CPU latency request (ie_cpulat.h). */
#include "ie_cpulat.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CPULAT_MAX_US 1000000L

static int g_fd = -1; /* open for the life of the process: closing it drops the request */
static long g_us = -1;

ie_status_t ie_cpulat_hold(long us)
{
    if (us < 0 || us > CPULAT_MAX_US)
        return ie_error_set(IE_ERR_INVAL, "CPU latency %ld us: 0..%ld", us, CPULAT_MAX_US);
    int fd = open("/dev/cpu_dma_latency", O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return ie_error_set(IE_ERR_IO, "CPU latency: cannot open /dev/cpu_dma_latency: %s", strerror(errno));
    const int32_t v = (int32_t)us; /* the kernel reads a binary s32 */
    if (write(fd, &v, sizeof v) != (ssize_t)sizeof v) {
        const int e = errno;
        close(fd);
        return ie_error_set(IE_ERR_IO, "CPU latency: cannot write /dev/cpu_dma_latency: %s", strerror(e));
    }
    if (g_fd >= 0) close(g_fd); /* the new request is in: drop the old one */
    g_fd = fd;
    g_us = us;
    return IE_OK;
}

long ie_cpulat_held(void) { return g_us; }

ie_status_t ie_cpulat_setting(const char *flag, long *us)
{
    const char *text = flag ? flag : getenv("IE_CPU_LATENCY_US");
    *us = -1;
    if (!text) return IE_OK;
    char *end = NULL;
    errno = 0;
    const long v = strtol(text, &end, 10);
    if (!(text[0] >= '0' && text[0] <= '9') || errno || !end || *end || v < 0 || v > CPULAT_MAX_US)
        return ie_error_set(IE_ERR_INVAL, "%s '%s': a whole number of microseconds, 0..%ld",
                            flag ? "--cpu-latency-us" : "IE_CPU_LATENCY_US", text, CPULAT_MAX_US);
    *us = v;
    return IE_OK;
}

ie_status_t ie_cpulat_apply(const char *flag, const char *who)
{
    long us;
    ie_status_t st = ie_cpulat_setting(flag, &us);
    if (st != IE_OK || us < 0) return st;
    if (ie_cpulat_hold(us) != IE_OK) fprintf(stderr, "%s: warning: %s\n", who, ie_error_last());
    return IE_OK;
}
