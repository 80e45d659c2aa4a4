/*
 * A stand-in for libgupnp-igd-1.0.so.4 with UPnP port mapping switched off.
 *
 * Debian 12's libnice links libgupnp-igd, which loads libsoup 3; simple-whip-client links
 * libsoup 2, and libsoup aborts a process holding both ("libsoup2 symbols detected"). The
 * CLI client runs with this library first on its LD_LIBRARY_PATH: libnice finds no IGD
 * (gupnp_simple_igd_thread_new returns NULL, which libnice handles by turning UPnP off) and
 * libsoup 3 is never loaded. Nothing else changes; UPnP has nothing to map in a test.
 */
typedef unsigned long GType;

void *gupnp_simple_igd_thread_new(void) { return 0; }
GType gupnp_simple_igd_get_type(void) { return 0; }
void gupnp_simple_igd_add_port(void *self, const char *protocol, unsigned external_port,
                               const char *local_ip, unsigned local_port, unsigned lease,
                               const char *description) {}
void gupnp_simple_igd_remove_port_local(void *self, const char *protocol,
                                        const char *local_ip, unsigned local_port) {}
