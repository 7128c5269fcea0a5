/* ie_cpulat.h — keep the CPUs' wake-up latency low while this process
 * runs (Linux PM QoS, /dev/cpu_dma_latency).
 *
 * A distributed step hops between threads and processes several times
 * (ZeroMQ's I/O threads, the coordinator, the ranks). Each hop wakes a
 * thread whose CPU may be idle, and an idle CPU in a deep sleep state (in
 * a VM: halted, woken by the hypervisor) takes tens of microseconds to
 * answer. A PM QoS request of 0 us keeps idle CPUs polling instead, for
 * as long as the request's file stays open: the operating system's own
 * knob (tuned's latency-performance profile holds the same request), at
 * the price of idle CPUs that spin. Opt-in: IE_CPU_LATENCY_US or
 * --cpu-latency-us. */
#ifndef IE_CPULAT_H
#define IE_CPULAT_H

#include "ie_status.h"

/* Hold a request that no CPU takes longer than us microseconds (0..1e6)
 * to wake, until the process exits (one request per process; a second
 * call replaces the first). IE_ERR_INVAL for a value out of range; IE_ERR_IO
 * naming the cause when /dev/cpu_dma_latency cannot be opened or written
 * (it is root's unless a udev rule says otherwise): nothing held then. */
ie_status_t ie_cpulat_hold(long us);

/* The request held (us), or -1. */
long ie_cpulat_held(void);

/* The value of --cpu-latency-us when given (flag != NULL), else of the
 * environment's IE_CPU_LATENCY_US; *us = -1 when neither is set.
 * IE_ERR_INVAL naming the bad text. */
ie_status_t ie_cpulat_setting(const char *flag, long *us);

/* ie_cpulat_setting, then ie_cpulat_hold when one is set: the binaries'
 * start-up. A request that cannot be held is a warning on stderr naming
 * `who`, not an error (IE_OK); a bad value is IE_ERR_INVAL. */
ie_status_t ie_cpulat_apply(const char *flag, const char *who);

#endif
