/* Rail state of the verbs backend: up, down or probing, and the thread that watches the port.
 *
 * A rail (one device port of this process) is planned only while it is UP.
 * It goes DOWN when its port leaves ACTIVE: the device's async event
 * IBV_EVENT_PORT_ERR (or IBV_EVENT_DEVICE_FATAL), read by a thread of its
 * own on the device's async fd so the batch path never waits for it, or a
 * port query after a READ on it failed with a transport error (verbs.c).
 * When the port is ACTIVE again (IBV_EVENT_PORT_ACTIVE, or the thread's
 * periodic port query) the rail waits in PROBE until one probe read over it
 * succeeds (verbs.c batch_probes), then it is UP again. A rail nobody reads
 * over (a producer's) has nothing to probe with: it is UP as soon as its
 * port is ACTIVE. Transitions take the rail's mutex; the batch path only
 * loads the state.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "clock.h"
#include "verbs.h"

const char *pv_port_state_name(int state) {
    switch (state) {
    case IBV_PORT_NOP: return "NOP";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "unknown";
    }
}

void pv_rail_state_init(pv_rail *r) {
    atomic_init(&r->state, PV_RAIL_UP);
    atomic_init(&r->readers, 0);
    atomic_init(&r->backed_off, 0);
    pthread_mutex_init(&r->smu, NULL);
    r->since = pc_mono_s();
    r->backoff = PV_RETRY_MIN_S;
    r->wake_fd = -1;
}

void pv_rail_down(pv_rail *r, const char *why) {
    pthread_mutex_lock(&r->smu);
    int was = atomic_load(&r->state);
    if (was == PV_RAIL_UP) pv_count(&r->n.downs, 1);
    if (was != PV_RAIL_DOWN) {
        snprintf(r->why, sizeof r->why, "%s", why);
        r->since = pc_mono_s();
        atomic_store_explicit(&r->state, PV_RAIL_DOWN, memory_order_release);
    }
    pthread_mutex_unlock(&r->smu);
}

void pv_rail_port_active(pv_rail *r) {
    pthread_mutex_lock(&r->smu);
    if (atomic_load(&r->state) == PV_RAIL_DOWN) {
        int probe = atomic_load(&r->readers) > 0;
        if (!probe) pv_count(&r->n.ups, 1);
        r->since = pc_mono_s();
        r->backoff = PV_RETRY_MIN_S;
        atomic_store(&r->backed_off, 0);
        atomic_store_explicit(&r->state, probe ? PV_RAIL_PROBE : PV_RAIL_UP, memory_order_release);
    }
    pthread_mutex_unlock(&r->smu);
}

void pv_rail_probe_ok(pv_rail *r) {
    pthread_mutex_lock(&r->smu);
    if (atomic_load(&r->state) == PV_RAIL_PROBE) {
        pv_count(&r->n.ups, 1);
        r->since = pc_mono_s();
        r->why[0] = '\0';
        r->backoff = PV_RETRY_MIN_S;
        atomic_store(&r->backed_off, 0);
        atomic_store_explicit(&r->state, PV_RAIL_UP, memory_order_release);
    }
    pthread_mutex_unlock(&r->smu);
}

int pv_rail_port_state(pv_rail *r) {
    struct ibv_port_attr pa;
    if (ibv_query_port(r->ctx, (uint8_t)r->port, &pa) != 0) return -1;
    return (int)pa.state;
}

double pv_rail_next_backoff(pv_rail *r) {
    pthread_mutex_lock(&r->smu);
    double b = r->backoff;
    r->backoff = b * 2 > PV_RETRY_MAX_S ? PV_RETRY_MAX_S : b * 2;
    atomic_store(&r->backed_off, 1);
    pthread_mutex_unlock(&r->smu);
    return b;
}

void pv_rail_reset_backoff(pv_rail *r) {
    pthread_mutex_lock(&r->smu);
    r->backoff = PV_RETRY_MIN_S;
    atomic_store(&r->backed_off, 0);
    pthread_mutex_unlock(&r->smu);
}

void pv_rail_describe(pv_rail *r, char *buf, size_t len) {
    pthread_mutex_lock(&r->smu);
    int st = atomic_load(&r->state);
    double ago = pc_mono_s() - r->since;
    if (st == PV_RAIL_UP)
        snprintf(buf, len, "%s: up", r->name);
    else if (st == PV_RAIL_DOWN)
        snprintf(buf, len, "%s: down (%s, %.1f s ago)", r->name, r->why, ago);
    else
        snprintf(buf, len, "%s: down, its port ACTIVE again %.1f s ago and no probe read has succeeded yet "
                 "(went down: %s)", r->name, ago, r->why);
    pthread_mutex_unlock(&r->smu);
}

/* One async event of the device: port events of our port change the state; every event is
 * acknowledged at once (destroying a QP or CQ waits for its events' acknowledgements). */
static void on_event(pv_rail *r, struct ibv_async_event *ev) {
    switch (ev->event_type) {
    case IBV_EVENT_PORT_ERR:
        if (ev->element.port_num == r->port)
            pv_rail_down(r, "its port left ACTIVE: IBV_EVENT_PORT_ERR");
        break;
    case IBV_EVENT_PORT_ACTIVE:
        if (ev->element.port_num == r->port) pv_rail_port_active(r);
        break;
    case IBV_EVENT_DEVICE_FATAL:
        pv_rail_down(r, "the device reported a fatal error: IBV_EVENT_DEVICE_FATAL");
        break;
    default:
        break;   /* QP and CQ events: the batch path sees their completions */
    }
}

int pv_rail_check_port(pv_rail *r) {
    int st = pv_rail_port_state(r);
    if (st < 0) return -1;
    if (st == IBV_PORT_ACTIVE) {
        pv_rail_port_active(r);
        return 1;
    }
    char why[96];
    snprintf(why, sizeof why, "its port is %s (ibv_query_port)", pv_port_state_name(st));
    pv_rail_down(r, why);
    return 0;
}

static void *watch(void *arg) {
    pv_rail *r = arg;
    struct pollfd p[2] = {{.fd = r->ctx->async_fd, .events = POLLIN}, {.fd = r->wake_fd, .events = POLLIN}};
    for (;;) {
        p[0].revents = p[1].revents = 0;
        int n = poll(p, 2, PV_PORT_CHECK_MS);
        if (n < 0) {
            if (errno == EINTR) continue;
            usleep(100 * 1000);   /* never spin; the port query below still runs */
        }
        if (p[1].revents) break;
        if (n > 0 && (p[0].revents & POLLIN)) {
            struct ibv_async_event ev;
            while (ibv_get_async_event(r->ctx, &ev) == 0) {
                on_event(r, &ev);
                ibv_ack_async_event(&ev);
            }
        } else {
            pv_rail_check_port(r);   /* between events, in case one was missed */
        }
    }
    return NULL;
}

int pv_rail_watch(pv_rail *r, char *err, size_t errlen) {
    int fl = fcntl(r->ctx->async_fd, F_GETFL);
    if (fl < 0 || fcntl(r->ctx->async_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        snprintf(err, errlen, "%s: cannot make its async event fd non-blocking: %s", r->name, strerror(errno));
        return -1;
    }
    r->wake_fd = eventfd(0, EFD_CLOEXEC);
    if (r->wake_fd < 0) {
        snprintf(err, errlen, "%s: eventfd for its port watcher: %s", r->name, strerror(errno));
        return -1;
    }
    int rc = pthread_create(&r->watcher, NULL, watch, r);
    if (rc != 0) {
        close(r->wake_fd);
        r->wake_fd = -1;
        snprintf(err, errlen, "%s: cannot start its port watcher thread: %s", r->name, strerror(rc));
        return -1;
    }
    r->watching = 1;
    return 0;
}

void pv_rail_unwatch(pv_rail *r) {
    if (r->watching) {
        uint64_t one = 1;
        if (write(r->wake_fd, &one, sizeof one) != (ssize_t)sizeof one) {
            /* an eventfd write of 1 cannot fail short of a bad fd; join anyway */
        }
        pthread_join(r->watcher, NULL);
        r->watching = 0;
    }
    if (r->wake_fd >= 0) close(r->wake_fd);
    r->wake_fd = -1;
}
