/* proc.c — facts about this process (ie_proc.h). */
#include "ie_proc.h"

#include <stdio.h>
#include <sys/resource.h>

/* VmHWM is the high-water mark of our own address space. getrusage's
 * ru_maxrss is only the fallback: Linux folds the pre-exec image's peak
 * into it, so a process started by a large parent (a Python harness:
 * vfork + exec) would report the parent's size. */
double ie_rss_peak_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        long kb = -1;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
        fclose(f);
        if (kb >= 0) return kb / 1024.0;
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
    return ru.ru_maxrss / 1024.0;
}
