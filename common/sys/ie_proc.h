/* ie_proc.h — facts about this process. */
#ifndef IE_PROC_H
#define IE_PROC_H

/* Peak resident memory of this process image in MB: VmHWM of
 * /proc/self/status, else getrusage's ru_maxrss. Never fails (0 when
 * neither can be read). */
double ie_rss_peak_mb(void);

#endif
