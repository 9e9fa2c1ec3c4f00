/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * flow.h — the kernel↔Go contract of tapflow's capture.
 *
 * Every struct here is mirrored byte for byte by Go (bpf2go generates the
 * Go types from BTF; layout_test.go checks sizes and offsets). Change a
 * struct → run `make generate` and update the layout test; never reorder
 * fields without bumping the record version.
 *
 * Integers are host byte order unless the field name says _be. Times are
 * CLOCK_MONOTONIC_COARSE nanoseconds (bpf_ktime_get_coarse_ns); userspace
 * converts them to wall-clock with a boot-time offset.
 */
#ifndef TAPFLOW_FLOW_H
#define TAPFLOW_FLOW_H

#include <linux/types.h>

/* Direction from the VM's point of view. Ingress of a tap = the VM sent it. */
enum flow_direction {
	DIR_TX = 0, /* tap ingress: VM → host */
	DIR_RX = 1, /* tap egress: host → VM */
};

/* Why a record left the kernel. 0 is never written. */
enum end_reason {
	END_NONE = 0,
	END_FIN = 1,
	END_RST = 2,
	END_ACTIVE_TIMEOUT = 3,
	END_IDLE_TIMEOUT = 4,
	END_OVERFLOW = 5,
	END_SHUTDOWN = 6,
};

/* Flow table key: 60 bytes, no implicit padding. IPv4 addresses are stored
 * as IPv4-mapped IPv6 (::ffff:a.b.c.d). For ICMP/ICMPv6 src_port holds the
 * type and dst_port the code; for fragments after the first, both are 0. */
struct flow_key {
	__u32 ifindex;
	__u8 direction; /* enum flow_direction */
	__u8 protocol;  /* IANA L4 protocol (after IPv6 extension headers) */
	__u16 vlan_id;  /* 802.1Q VID, 0 when untagged */
	__u8 src_mac[6];
	__u8 dst_mac[6];
	__u16 eth_proto; /* 0x0800 or 0x86DD (host order) */
	__u16 src_port;
	__u16 dst_port;
	__u16 _pad;
	__u8 src_ip[16];
	__u8 dst_ip[16];
};

/* Flow-table keys. The kernel keeps IPv4 and IPv6 flows in two tables with
 * keys of their own size (the key is hashed and compared on every packet:
 * ~0.7 ns per key byte); records always carry the full struct flow_key.
 * Both keys share their first 24 bytes (ifindex … dst_port). */
struct flow_key4 { /* 32 bytes */
	__u32 ifindex;
	__u8 direction;
	__u8 protocol;
	__u16 vlan_id;
	__u8 src_mac[6];
	__u8 dst_mac[6];
	__u16 src_port;
	__u16 dst_port;
	__u8 src_ip[4];
	__u8 dst_ip[4];
};

struct flow_key6 { /* 56 bytes */
	__u32 ifindex;
	__u8 direction;
	__u8 protocol;
	__u16 vlan_id;
	__u8 src_mac[6];
	__u8 dst_mac[6];
	__u16 src_port;
	__u16 dst_port;
	__u8 src_ip[16];
	__u8 dst_ip[16];
};

/* Record value: 40 bytes (the flow table holds struct flow_ent). */
struct flow_val {
	__u64 bytes;    /* Σ skb->len */
	__u64 packets;  /* skbs (a GSO super-packet counts once) */
	__u64 first_ns; /* first packet of the current record */
	__u64 last_ns;  /* last packet seen */
	__u32 tcp_flags; /* OR of TCP flag bytes */
	__u32 dead;      /* enum end_reason once an exporter has claimed it */
};

/* Flow-table value: 48 bytes. One atomic add per packet that reaches the
 * table (merged cache slots add to bytes/packets directly): `count` packs the
 * packets (high 24 bits) and bytes (low 40 bits) added since the last
 * spill. Whoever's add takes either half past its midpoint moves `count`
 * into the 64-bit `bytes`/`packets` (atomic exchange, then atomic adds), so
 * neither half can overflow: an entry holds count + bytes/packets. Every
 * field leaves the entry only through an atomic exchange. */
struct flow_ent {
	__u64 count;    /* packets << 40 | bytes, since the last spill */
	__u64 bytes;    /* spilled bytes */
	__u64 packets;  /* spilled packets */
	__u64 first_ns; /* first packet of the current record */
	__u64 last_ns;  /* last packet seen */
	__u32 tcp_flags; /* OR of TCP flag bytes */
	__u32 dead;      /* enum end_reason once an exporter has claimed it */
};

#define FLOW_COUNT_PKT_SHIFT 40
#define FLOW_COUNT_BYTES_MASK ((1ULL << FLOW_COUNT_PKT_SHIFT) - 1)
/* An add that sets either bit spills: bytes ≥ 2^39 or packets ≥ 2^23. */
#define FLOW_COUNT_SPILL ((1ULL << 39) | (1ULL << 63))

/* Ring-buffer record: 104 bytes. */
struct flow_record {
	struct flow_key key;
	__u8 end_reason; /* enum end_reason */
	__u8 _pad[3];
	struct flow_val val; /* val.dead is 0 */
};

/* Per-CPU meter of one (interface slot, direction). Slot 0 collects frames
 * of interfaces userspace did not register. 64 bytes. */
struct meter {
	__u64 packets;        /* IP frames seen (each becomes part of a record) */
	__u64 bytes;          /* Σ skb->len of those frames */
	__u64 lost_packets;   /* packets of records the ring buffer refused */
	__u64 lost_bytes;     /* bytes of records the ring buffer refused */
	__u64 failed_updates; /* flow-table inserts that failed (table full) */
	__u64 skipped_packets; /* non-IP frames, not counted above */
	__u64 skipped_bytes;
	__u64 records; /* records submitted from the packet path */
};

/* Context of the sweep program (BPF_PROG_TYPE_SYSCALL, run from userspace
 * with BPF_PROG_TEST_RUN). */
struct sweep_args {
	__u64 idle_ns;     /* in: export flows idle at least this long; 0 = all */
	__u32 reason;      /* in: end reason of the records (idle/shutdown) */
	__u32 max_records; /* in: stop after this many records */
	__u64 now_ns;      /* in: CLOCK_MONOTONIC_COARSE now (syscall programs
	                    * cannot call bpf_ktime_get_coarse_ns) */
	__u32 scanned;     /* out: entries visited */
	__u32 exported;    /* out: records submitted */
	__u32 deleted;     /* out: entries removed (exported or empty) */
	__u32 deferred;    /* out: 1 when the ring buffer was full: run again */
};

/* Per-CPU flow cache slot: 128 bytes (two cache lines; a v4 hit or miss
 * touches only the first). The packet path adds to the slot of its CPU with
 * plain adds; the slot is merged into the flow table when another flow is
 * admitted, on FIN/RST, at the active timeout and by the flush program
 * after a generation flip. */
struct flow_cent {
	__u64 bytes;
	__u64 packets;
	__u32 last_jiffies; /* jiffies (low 32 bits) of the last packet: a hit
	                     * in the same tick reads no clock */
	__u32 cand;      /* admission: tag of the flow whose packet was the
	                  * slot's last one and went to the table (0 none) */
	__u32 tcp_flags;
	__u32 kind;      /* 0 empty, 1 IPv4 (key is a flow_key4), 2 IPv6 */
	__u8 key[56];    /* struct flow_key4 (32 bytes, rest 0) or flow_key6 */
	__u64 first_ns;
	__u64 last_ns;   /* coarse time of the first packet in tick last_jiffies */
	__u64 _pad[3];
};

/* The flow cache's bypass state, one per CPU (see account in flow.bpf.c). */
struct cache_state {
	__u32 bypass; /* packets left to count in the table without a probe */
	__u32 probes; /* packets probed in the current window */
	__u32 hits;   /* of them, counted in their slot */
	__u32 bypasses; /* bypasses started (read by userspace: a metric) */
};

#define CENT_EMPTY 0
#define CENT_V4 1
#define CENT_V6 2

/* Context of the flush program: merges the flow cache generation that is
 * no longer current (outer slot 1) into the flow tables. */
struct flush_args {
	__u32 start;  /* in: first position (cpu * slots + slot) to visit */
	__u32 end;    /* in: one past the last position (possible CPUs * slots) */
	__u32 next;   /* out: where to resume when deferred */
	__u32 merged; /* out: slots merged into the tables */
	__u32 deferred; /* out: 1 when the ring buffer ran low: drain, run again */
	__u32 _pad;
};

/* Fixed sizes that are not configuration. */
#define IFSLOT_ARRAY_MAX 65536 /* ifindex below this: array lookup */

#endif /* TAPFLOW_FLOW_H */
