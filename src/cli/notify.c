/* notify.c — readiness for a service manager: systemd's sd_notify protocol
 * (a datagram "READY=1", "STOPPING=1", "STATUS=..." to $NOTIFY_SOCKET),
 * through Debian's libsystemd when the build found it (KS_HAVE_LIBSYSTEMD).
 * Without NOTIFY_SOCKET, or without libsystemd, nothing is sent.
 * packaging/kvseal.service runs serve as Type=notify. */
#include "cli_int.h"

#include <stdarg.h>

#ifdef KS_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

bool cli__notify_available(void) {
#ifdef KS_HAVE_LIBSYSTEMD
    return true;
#else
    return false;
#endif
}

void cli__notify(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
#ifdef KS_HAVE_LIBSYSTEMD
    // 0: keep NOTIFY_SOCKET for the states that follow
    int r = sd_notify(0, msg);
    if (r < 0) ks_log(KS_LOG_DEBUG, "sd_notify %s: error %d", msg, r);
#else
    (void)msg;
#endif
}
