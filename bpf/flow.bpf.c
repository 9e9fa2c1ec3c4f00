//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tapflow capture: per-flow aggregation on VM taps.
 *
 * tc_ingress / tc_egress are attached (tcx, or clsact + cls_bpf) to every
 * tap: ingress = the VM sent the frame (tx), egress = the VM receives (rx).
 * They never drop or alter a frame and always return TC_ACT_UNSPEC (tcx:
 * TCX_NEXT), so that programs and filters after them — e.g. Neutron QoS
 * policers on the tap — still decide the verdict.
 *
 * Conservation: every IP frame is counted in the per-CPU meter of its
 * (interface, direction) and added to exactly one place: its CPU's flow
 * cache slot, a flow-table entry, or a record of its own. A cache slot is
 * written only by its CPU's packets (a flow enters it when the slot is
 * empty or on its second packet in a row there, see account), and merged
 * into the table (as one add) by that CPU or, once its generation is flipped out and no program
 * can still run on it, by the flush program. Counters leave an entry only
 * through an atomic exchange, so each byte is exported exactly once: by
 * the exporter that wins the entry's `dead` flag, by a late updater that
 * finds the flag set, or by an active-timeout export. A ring-buffer
 * refusal is counted as lost.
 */
#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "flow.h"

#ifndef offsetof
#define offsetof(t, m) __builtin_offsetof(t, m)
#endif

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define EEXIST 17
#define TH_FIN 0x01
#define TH_RST 0x04
#define IP_OFFSET_MASK 0x1fff
#define PULL_MAX 192

/* Set by the loader before load (rodata). */
volatile const __u64 active_timeout_ns = 10000000000ULL;

/* Flows live in the table of their address family, each with a key of its
 * own size; the loader sizes both from capture.memory_budget. */
/* Sizes are placeholders: the loader sets them from capture.memory_budget. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct flow_key4);
	__type(value, struct flow_ent);
} flows4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct flow_key6);
	__type(value, struct flow_ent);
} flows6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} records SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2 * 1025);
	__type(key, __u32);
	__type(value, struct meter);
} meters SEC(".maps");

/* ifindex → meter slot (0 = unregistered). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, IFSLOT_ARRAY_MAX);
	__type(key, __u32);
	__type(value, __u32);
} if_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u32);
} if_slots_big SEC(".maps");


/* Keeps struct flow_record in BTF for bpf2go (it lands in .rodata). */
const struct flow_record *const flow_record_btf = 0;

enum parse_result {
	PARSE_IP4 = 0,
	PARSE_IP6 = 1,
	PARSE_NONIP = 2,
	PARSE_PULL = 3, /* headers are beyond the linear area: pull, re-parse */
};

/* The two keys share their first 24 bytes; parse writes those through k4. */
union fkey {
	struct flow_key4 k4;
	struct flow_key6 k6;
} __attribute__((aligned(8)));

struct vlanhdr {
	__be16 tci;
	__be16 proto;
};

struct ip6_ext {
	__u8 nexthdr;
	__u8 hdrlen;
};

struct ip6_frag {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 id;
};

/* The frame is shorter in the linear area than the header we need: ask for
 * a pull when the skb holds more, else treat it as truncated. */
#define NEED(p, n, truncated)                                                  \
	do {                                                                   \
		if ((void *)(p) + (n) > end)                                   \
			return more ? PARSE_PULL : (truncated);                \
	} while (0)

static __always_inline int parse_l4(void *data, void *end, __u32 off, bool more,
				    struct flow_key4 *k, __u32 *flags, int ip)
{
	void *l4 = data + off;

	switch (k->protocol) {
	case IPPROTO_TCP:
		NEED(l4, 14, ip);
		k->src_port = bpf_ntohs(*(__be16 *)l4);
		k->dst_port = bpf_ntohs(*(__be16 *)(l4 + 2));
		*flags = *(__u8 *)(l4 + 13);
		break;
	case IPPROTO_UDP:
	case IPPROTO_UDPLITE:
	case IPPROTO_SCTP:
		NEED(l4, 4, ip);
		k->src_port = bpf_ntohs(*(__be16 *)l4);
		k->dst_port = bpf_ntohs(*(__be16 *)(l4 + 2));
		break;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		NEED(l4, 2, ip);
		k->src_port = *(__u8 *)l4;       /* type */
		k->dst_port = *(__u8 *)(l4 + 1); /* code */
		break;
	}
	return ip;
}

static __always_inline int parse(struct __sk_buff *skb, union fkey *u,
				 __u32 *flags, bool can_pull)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	bool more = can_pull && skb->len > (__u32)(end - data);
	struct flow_key4 *k = &u->k4;
	__be16 proto;
	__u32 off = ETH_HLEN;

	/* The common 24 bytes; the addresses are always written below. */
	__builtin_memset(k, 0, offsetof(struct flow_key4, src_ip));
	*flags = 0;

	NEED(data, ETH_HLEN, PARSE_NONIP);
	/* Word loads (unaligned packet access is allowed), aligned stores. */
	*(__u32 *)&k->src_mac[0] = *(__u32 *)(data + 6);
	*(__u16 *)&k->src_mac[4] = *(__u16 *)(data + 10);
	*(__u16 *)&k->dst_mac[0] = *(__u16 *)(data + 0);
	*(__u32 *)&k->dst_mac[2] = *(__u32 *)(data + 2);
	proto = *(__be16 *)(data + 12);

	if (skb->vlan_present) {
		k->vlan_id = skb->vlan_tci & 0x0fff;
	} else if (proto == bpf_htons(ETH_P_8021Q)) {
		struct vlanhdr *vh = data + off;
		NEED(vh, sizeof(*vh), PARSE_NONIP);
		k->vlan_id = bpf_ntohs(vh->tci) & 0x0fff;
		proto = vh->proto;
		off += sizeof(*vh);
	}

	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = data + off;

		*(__u64 *)k->src_ip = 0;
		NEED(ip, sizeof(*ip), PARSE_IP4);
		*(__u32 *)k->src_ip = ip->saddr;
		*(__u32 *)k->dst_ip = ip->daddr;
		k->protocol = ip->protocol;
		__u32 ihl = ip->ihl * 4;
		if (ihl < sizeof(*ip))
			return PARSE_IP4; /* bogus IHL: addresses only */
		if (ip->frag_off & bpf_htons(IP_OFFSET_MASK))
			return PARSE_IP4; /* later fragment: no L4 header */
		return parse_l4(data, end, off + ihl, more, k, flags, PARSE_IP4);
	}

	if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data + off;
		struct flow_key6 *k6 = &u->k6;

		__builtin_memset(k6->src_ip, 0, 32);
		NEED(ip6, sizeof(*ip6), PARSE_IP6);
		__builtin_memcpy(k6->src_ip, &ip6->saddr, 16);
		__builtin_memcpy(k6->dst_ip, &ip6->daddr, 16);
		__u8 nh = ip6->nexthdr;
		off += sizeof(*ip6);

		/* Walk at most 6 extension headers. */
#pragma unroll
		for (int i = 0; i < 6; i++) {
			if (nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING ||
			    nh == IPPROTO_DSTOPTS || nh == 135 /* mobility */) {
				struct ip6_ext *x = data + off;
				k->protocol = nh;
				NEED(x, sizeof(*x), PARSE_IP6);
				nh = x->nexthdr;
				off += (x->hdrlen + 1) * 8;
			} else if (nh == IPPROTO_AH) {
				struct ip6_ext *x = data + off;
				k->protocol = nh;
				NEED(x, sizeof(*x), PARSE_IP6);
				nh = x->nexthdr;
				off += (x->hdrlen + 2) * 4;
			} else if (nh == IPPROTO_FRAGMENT) {
				struct ip6_frag *f = data + off;
				k->protocol = nh;
				NEED(f, sizeof(*f), PARSE_IP6);
				nh = f->nexthdr;
				if (f->frag_off & bpf_htons(0xfff8)) {
					k->protocol = nh; /* later fragment */
					return PARSE_IP6;
				}
				off += sizeof(*f);
			} else {
				break;
			}
		}
		k->protocol = nh;
		return parse_l4(data, end, off, more, k, flags, PARSE_IP6);
	}

	return PARSE_NONIP;
}

static __always_inline struct meter *meter_for(__u32 ifindex, __u32 dir)
{
	__u32 slot = 0, *s;

	/* Two call sites on purpose: clang would otherwise merge them into one
	 * bpf_map_lookup_elem with the map chosen by a branch, which the
	 * verifier cannot inline (the array lookup becomes an indirect helper
	 * call, measured +20 ns per packet). The empty asm keeps them apart. */
	if (ifindex < IFSLOT_ARRAY_MAX) {
		s = bpf_map_lookup_elem(&if_slots, &ifindex);
	} else {
		s = bpf_map_lookup_elem(&if_slots_big, &ifindex);
		asm volatile("" : "+r"(s));
	}
	if (s)
		slot = *s;
	__u32 idx = slot * 2 + dir;
	return bpf_map_lookup_elem(&meters, &idx);
}

/* put_key writes the record key of a table key (v6: struct flow_key6). */
static __always_inline void put_key(struct flow_key *r, const union fkey *u,
				    bool v6)
{
	__builtin_memcpy(r, u, 20); /* ifindex … dst_mac */
	r->src_port = u->k4.src_port;
	r->dst_port = u->k4.dst_port;
	r->_pad = 0;
	if (v6) {
		r->eth_proto = ETH_P_IPV6;
		__builtin_memcpy(r->src_ip, u->k6.src_ip, 32);
	} else {
		r->eth_proto = ETH_P_IP;
		/* IPv4-mapped IPv6 ::ffff:a.b.c.d (little-endian words) */
		*(__u32 *)&r->src_ip[0] = 0;
		*(__u32 *)&r->src_ip[4] = 0;
		*(__u32 *)&r->src_ip[8] = 0xffff0000;
		*(__u32 *)&r->src_ip[12] = *(__u32 *)u->k4.src_ip;
		*(__u32 *)&r->dst_ip[0] = 0;
		*(__u32 *)&r->dst_ip[4] = 0;
		*(__u32 *)&r->dst_ip[8] = 0xffff0000;
		*(__u32 *)&r->dst_ip[12] = *(__u32 *)u->k4.dst_ip;
	}
}

/* emit submits one record. m may be NULL (sweep): then a full ring is the
 * caller's business. Returns 0 on success. */
static __always_inline int emit(const union fkey *k, bool v6, __u64 bytes,
				__u64 packets, __u64 first, __u64 last,
				__u32 flags, __u8 reason, struct meter *m)
{
	if (!bytes && !packets)
		return 0;
	struct flow_record *r = bpf_ringbuf_reserve(&records, sizeof(*r), 0);
	if (!r) {
		if (m) {
			m->lost_packets += packets;
			m->lost_bytes += bytes;
		}
		return -1;
	}
	put_key(&r->key, k, v6);
	r->end_reason = reason;
	r->_pad[0] = 0;
	r->_pad[1] = 0;
	r->_pad[2] = 0;
	r->val.bytes = bytes;
	r->val.packets = packets;
	r->val.first_ns = first;
	r->val.last_ns = last;
	r->val.tcp_flags = flags;
	r->val.dead = 0;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	if (m)
		m->records++;
	return 0;
}

/* take empties the entry's counters (atomic exchanges). */
static __always_inline void take(struct flow_ent *v, __u64 *b, __u64 *p,
				 __u32 *f)
{
	__u64 c = __atomic_exchange_n(&v->count, 0, __ATOMIC_SEQ_CST);

	*b = __atomic_exchange_n(&v->bytes, 0, __ATOMIC_SEQ_CST) +
	     (c & FLOW_COUNT_BYTES_MASK);
	*p = __atomic_exchange_n(&v->packets, 0, __ATOMIC_SEQ_CST) +
	     (c >> FLOW_COUNT_PKT_SHIFT);
	*f = __atomic_exchange_n(&v->tcp_flags, 0, __ATOMIC_SEQ_CST);
}

/* spill moves count into the 64-bit counters before a half overflows. An
 * exporter may run between the exchange and the adds: what it misses stays
 * in bytes/packets, and the caller's dead check (after these adds) drains
 * it when the entry was claimed meanwhile. */
static __always_inline void spill(struct flow_ent *v)
{
	__u64 c = __atomic_exchange_n(&v->count, 0, __ATOMIC_SEQ_CST);

	__sync_fetch_and_add(&v->bytes, c & FLOW_COUNT_BYTES_MASK);
	__sync_fetch_and_add(&v->packets, c >> FLOW_COUNT_PKT_SHIFT);
}

/* drain exports whatever the entry holds now (atomically taken). */
static __always_inline void drain(const union fkey *k, bool v6,
				  struct flow_ent *v, __u64 last, __u8 reason,
				  struct meter *m)
{
	__u64 first = v->first_ns;
	__u64 b, p;
	__u32 f;

	take(v, &b, &p, &f);
	emit(k, v6, b, p, first, last, f, reason, m);
}

/* table_add adds pkts packets / bytes seen in [first, last] to the flow's
 * table entry (inserting it), and exports it when end is set (FIN/RST) or
 * its active timeout passed. */
static __always_inline void table_add(void *map, const union fkey *k, bool v6,
				      __u64 bytes, __u64 pkts, __u64 first,
				      __u64 last, __u32 flags, __u8 end,
				      struct meter *m)
{
	struct flow_ent *v = bpf_map_lookup_elem(map, k);

	if (!v) {
		if (end) {
			/* A flow that starts and ends here. */
			emit(k, v6, bytes, pkts, first, last, flags, end, m);
			return;
		}
		struct flow_ent nv = {
			.bytes = bytes,
			.packets = pkts,
			.first_ns = first,
			.last_ns = last,
			.tcp_flags = flags,
		};
		if ((__s64)(last - first) >= (__s64)active_timeout_ns) {
			/* A cache slot as old as the active timeout: export it,
			 * the entry starts empty (as after an export below). */
			emit(k, v6, bytes, pkts, first, last, flags,
			     END_ACTIVE_TIMEOUT, m);
			nv.bytes = 0;
			nv.packets = 0;
			nv.tcp_flags = 0;
			nv.first_ns = last;
		}
		long err = bpf_map_update_elem(map, k, &nv, BPF_NOEXIST);
		if (!err)
			return;
		if (err != -EEXIST) {
			m->failed_updates++;
			emit(k, v6, bytes, pkts, first, last, flags, END_OVERFLOW, m);
			return;
		}
		/* Another CPU inserted it first. */
		v = bpf_map_lookup_elem(map, k);
		if (!v) {
			emit(k, v6, bytes, pkts, first, last, flags, END_OVERFLOW, m);
			return;
		}
	}

	if (pkts == 1) {
		__u64 inc = (1ULL << FLOW_COUNT_PKT_SHIFT) | bytes;
		if ((__sync_fetch_and_add(&v->count, inc) + inc) & FLOW_COUNT_SPILL)
			spill(v);
	} else {
		/* A merged cache slot: any size, straight into the 64-bit
		 * counters. */
		__sync_fetch_and_add(&v->bytes, bytes);
		__sync_fetch_and_add(&v->packets, pkts);
	}
	if ((__s64)(last - v->last_ns) > 0)
		v->last_ns = last;
	if (flags & ~v->tcp_flags)
		__sync_fetch_and_or(&v->tcp_flags, flags);

	__u32 dead = *(volatile __u32 *)&v->dead;
	if (dead) {
		/* An exporter claimed the entry; it may have taken its counters
		 * before our add: export what is left ourselves. */
		drain(k, v6, v, last, dead, m);
		return;
	}
	if (end) {
		if (__atomic_exchange_n(&v->dead, end, __ATOMIC_SEQ_CST)) {
			drain(k, v6, v, last, end, m);
			return;
		}
		drain(k, v6, v, last, end, m);
		bpf_map_delete_elem(map, k);
		return;
	}
	__u64 f0 = v->first_ns;
	if ((__s64)(last - f0) >= (__s64)active_timeout_ns &&
	    __sync_val_compare_and_swap(&v->first_ns, f0, last) == f0) {
		__u64 b, p;
		__u32 f;

		take(v, &b, &p, &f);
		emit(k, v6, b, p, f0, last, f, END_ACTIVE_TIMEOUT, m);
	}
}

/* The per-CPU flow cache: a direct-mapped array of flow_cent per CPU, in
 * two generations. caches[0] is the generation the packet path uses;
 * caches[1] the one the flush program merges. Userspace flips them with
 * map updates, and an update of an array of maps returns only after every
 * running program is done (synchronize_rcu): a generation is never written
 * by a packet and read by the flush at once. Sizes are placeholders: the
 * loader sets them. */
struct flow_cache {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct flow_cent);
};

struct flow_cache cache0 SEC(".maps");
struct flow_cache cache1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 2);
	__type(key, __u32);
	__array(values, struct flow_cache);
} caches SEC(".maps") = {
	.values = {[0] = &cache0, [1] = &cache1},
};

/* Per CPU: whether the cache pays. A probe that finds no slot of its
 * flow costs a look at the slot on top of the table's update; with more
 * flows than slots and few packets of a flow in a row, almost every probe
 * is such a miss. So every CACHE_WINDOW probes, a CPU whose slots counted
 * fewer than CACHE_MIN_HITS of them sends its next CACHE_BYPASS packets
 * straight to the table, then probes again. Flows left in slots stay there
 * until the sweep's flush or a probe evicts them: a FIN that passes during
 * a bypass exports what the table holds, and the slot's share follows in a
 * later record of the same key, as across CPUs. */
#define CACHE_WINDOW 1024
#define CACHE_MIN_HITS (CACHE_WINDOW / 16)
#define CACHE_BYPASS 65536

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cache_state);
} cache_states SEC(".maps");

/* Set by the loader: cache slots per CPU − 1 (a power of two − 1), and
 * cache_off to send every packet to the table (tests, ablation; the
 * verifier prunes the branch it never takes). */
volatile const __u32 cache_mask = 1023;
volatile const __u8 cache_off = 0;

/* Keeps struct flow_cent in BTF for bpf2go. */
const struct flow_cent *const flow_cent_btf = 0;

#define HMUL 0x9E3779B97F4A7C15ULL

/* cache_tag is the flow's 32-bit hash with bit 31 set, so never 0 (the "no
 * candidate" of flow_cent.cand); its low bits pick the slot (tag &
 * cache_mask, at most 16 bits), and flows of one slot differ in the bits
 * above. */
static __always_inline __u32 cache_tag(const __u64 *w, bool v6)
{
	/* Fold to 32 bits, then one multiply (Fibonacci hashing: bits 32..63
	 * of the product depend on every folded bit). A collision only costs
	 * a table update. */
	__u64 h = w[0] ^ w[1] ^ w[2] ^ w[3];
	if (v6)
		h ^= w[4] ^ w[5] ^ w[6];
	h = (__u32)(h ^ (h >> 32)) * HMUL;
	return (__u32)(h >> 32) | 0x80000000;
}

static __always_inline bool cent_is(const struct flow_cent *c, const __u64 *w,
				    bool v6)
{
	const __u64 *ck = (const __u64 *)c->key;

	if (c->kind != (v6 ? CENT_V6 : CENT_V4))
		return false;
	if (ck[0] != w[0] || ck[1] != w[1] || ck[2] != w[2] || ck[3] != w[3])
		return false;
	if (v6 && (ck[4] != w[4] || ck[5] != w[5] || ck[6] != w[6]))
		return false;
	return true;
}

/* cent_merge moves a slot into the flow table and empties it. */
static __always_inline void cent_merge(struct flow_cent *c, struct meter *m)
{
	const union fkey *k = (const union fkey *)c->key;

	/* One call site per table, kept apart (see meter_for): a lookup of
	 * a map chosen by a branch is not inlined. */
	if (c->kind == CENT_V6) {
		table_add(&flows6, k, true, c->bytes, c->packets, c->first_ns,
			  c->last_ns, c->tcp_flags, 0, m);
	} else {
		asm volatile("" ::: "memory");
		table_add(&flows4, k, false, c->bytes, c->packets, c->first_ns,
			  c->last_ns, c->tcp_flags, 0, m);
	}
	c->kind = CENT_EMPTY;
}

/* account adds one packet to its CPU's cache slot or to the table.
 *
 * Admission (issue 24): a flow takes a slot only when it is empty or on the
 * flow's second packet in a row at that slot (cand: no other flow's packet
 * in between, hits reset it). A flow that is not cached costs the probe
 * and one table update, never an eviction: with many flows visited one
 * packet at a time (every packet a different flow at its slot) no flow is
 * admitted and the table alone counts them; a burst of one flow is
 * admitted at its second packet, evicting (merging) the occupant once, and
 * hits from there on. */
static __always_inline void account(void *map, union fkey *k, bool v6,
				    __u64 len, __u32 flags, struct meter *m)
{
	__u8 end = (flags & TH_RST) ? END_RST : ((flags & TH_FIN) ? END_FIN : 0);
	const __u64 *w = (const __u64 *)k;
	struct flow_cent *c = 0;
	struct cache_state *st = 0;
	__u32 z = 0, tag = 0;
	void *cache = 0;

	if (!cache_off)
		st = bpf_map_lookup_elem(&cache_states, &z);
	if (st && st->bypass) {
		st->bypass--;
	} else if (st) {
		if (++st->probes >= CACHE_WINDOW) {
			if (st->hits < CACHE_MIN_HITS) {
				st->bypass = CACHE_BYPASS;
				st->bypasses++;
			}
			st->probes = 0;
			st->hits = 0;
		}
		cache = bpf_map_lookup_elem(&caches, &z);
	}
	if (cache) {
		tag = cache_tag(w, v6);
		__u32 slot = tag & cache_mask;
		c = bpf_map_lookup_elem(cache, &slot);
	}
	if (!c) {
		__u64 now = bpf_ktime_get_coarse_ns();
		table_add(map, k, v6, len, 1, now, now, flags, end, m);
		return;
	}
	if (cent_is(c, w, v6)) {
		/* jiffies is a load (the verifier inlines it); the coarse clock
		 * a helper call, read once per tick per slot: last_ns is the
		 * coarse time of the slot's first packet in its last tick. */
		__u32 j = (__u32)bpf_jiffies64();
		if (!end && c->last_jiffies == j) {
			/* The hit: plain adds, this CPU's slot. */
			c->bytes += len;
			c->packets++;
			c->tcp_flags |= flags;
			c->cand = 0;
			st->hits++;
			return;
		}
		__u64 now = bpf_ktime_get_coarse_ns();
		if (!end && (__s64)(now - c->first_ns) < (__s64)active_timeout_ns) {
			c->bytes += len;
			c->packets++;
			c->tcp_flags |= flags;
			c->last_jiffies = j;
			c->last_ns = now;
			c->cand = 0;
			st->hits++;
			return;
		}
		/* FIN/RST or active timeout: the slot and this packet go to
		 * the table, which exports. */
		c->kind = CENT_EMPTY;
		table_add(map, k, v6, c->bytes + len, c->packets + 1,
			  c->first_ns, now, c->tcp_flags | flags, end, m);
		return;
	}
	if (end || (c->kind != CENT_EMPTY && c->cand != tag)) {
		/* A closing packet, or the flow's first packet in a row at an
		 * occupied slot: the table counts it; a second one admits. */
		if (!end)
			c->cand = tag;
		__u64 now = bpf_ktime_get_coarse_ns();
		table_add(map, k, v6, len, 1, now, now, flags, end, m);
		return;
	}
	if (c->kind != CENT_EMPTY) {
		/* The evicted flow's losses count on its own interface. */
		const struct flow_key4 *ck = (const struct flow_key4 *)c->key;
		struct meter *cm = m;
		if (ck->ifindex != k->k4.ifindex ||
		    ck->direction != k->k4.direction)
			cm = meter_for(ck->ifindex, ck->direction & 1);
		cent_merge(c, cm ? cm : m);
	}
	__u64 now = bpf_ktime_get_coarse_ns();
	__builtin_memcpy(c->key, k, v6 ? sizeof(struct flow_key6) : sizeof(struct flow_key4));
	if (!v6)
		__builtin_memset(c->key + sizeof(struct flow_key4), 0,
				 sizeof(c->key) - sizeof(struct flow_key4));
	c->bytes = len;
	c->packets = 1;
	c->first_ns = now;
	c->last_ns = now;
	c->last_jiffies = (__u32)bpf_jiffies64();
	c->cand = 0;
	c->tcp_flags = flags;
	c->kind = v6 ? CENT_V6 : CENT_V4;
}

static __always_inline int handle(struct __sk_buff *skb, __u32 dir)
{
	union fkey k;
	__u32 flags;
	int r = parse(skb, &k, &flags, true);

	if (r == PARSE_PULL) {
		__u32 n = skb->len;
		if (n > PULL_MAX)
			n = PULL_MAX;
		bpf_skb_pull_data(skb, n);
		r = parse(skb, &k, &flags, false);
	}

	struct meter *m = meter_for(skb->ifindex, dir);
	if (!m)
		return TC_ACT_UNSPEC;
	__u64 len = skb->len;
	if (r > PARSE_IP6) {
		m->skipped_packets++;
		m->skipped_bytes += len;
		return TC_ACT_UNSPEC;
	}
	m->packets++;
	m->bytes += len;

	k.k4.ifindex = skb->ifindex;
	k.k4.direction = dir;
	if (r == PARSE_IP4)
		account(&flows4, &k, false, len, flags, m);
	else
		account(&flows6, &k, true, len, flags, m);
	return TC_ACT_UNSPEC;
}

SEC("tc")
int tc_ingress(struct __sk_buff *skb)
{
	return handle(skb, DIR_TX);
}

SEC("tc")
int tc_egress(struct __sk_buff *skb)
{
	return handle(skb, DIR_RX);
}

/* tc_empty is the baseline for benchmarks: an attached program that does
 * nothing. Never attached in production. */
SEC("tc")
int tc_empty(struct __sk_buff *skb)
{
	return TC_ACT_UNSPEC;
}

struct sweep_ctx {
	__u64 now;
	__u64 idle;
	__u32 reason;
	__u32 max;
	__u32 scanned;
	__u32 exported;
	__u32 deleted;
	__u32 deferred;
};

static __always_inline long sweep_one(void *map, const union fkey *key,
				      bool v6, struct flow_ent *v,
				      struct sweep_ctx *c)
{
	c->scanned++;
	if (*(volatile __u32 *)&v->dead)
		return 0; /* another exporter owns it */
	__u64 last = v->last_ns;
	if (c->idle && (__s64)(c->now - last) < (__s64)c->idle)
		return 0;
	if (c->exported >= c->max) {
		c->deferred = 1;
		return 1;
	}
	/* Reserve before claiming: a full ring leaves the entry in place. */
	struct flow_record *r = bpf_ringbuf_reserve(&records, sizeof(*r), 0);
	if (!r) {
		c->deferred = 1;
		return 1;
	}
	if (__atomic_exchange_n(&v->dead, c->reason, __ATOMIC_SEQ_CST)) {
		bpf_ringbuf_discard(r, BPF_RB_NO_WAKEUP);
		return 0;
	}
	__u64 first = v->first_ns;
	__u64 b, p;
	__u32 f;
	union fkey k;

	take(v, &b, &p, &f);

	if (v6)
		__builtin_memcpy(&k.k6, key, sizeof(k.k6));
	else
		__builtin_memcpy(&k.k4, key, sizeof(k.k4));
	if (b || p) {
		put_key(&r->key, &k, v6);
		r->end_reason = c->reason;
		r->_pad[0] = 0;
		r->_pad[1] = 0;
		r->_pad[2] = 0;
		r->val.bytes = b;
		r->val.packets = p;
		r->val.first_ns = first;
		r->val.last_ns = v->last_ns;
		r->val.tcp_flags = f;
		r->val.dead = 0;
		bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
		c->exported++;
	} else {
		bpf_ringbuf_discard(r, BPF_RB_NO_WAKEUP);
	}
	bpf_map_delete_elem(map, &k);
	c->deleted++;
	return 0;
}

static long sweep4(void *map, struct flow_key4 *key, struct flow_ent *v,
		   struct sweep_ctx *c)
{
	return sweep_one(map, (const union fkey *)key, false, v, c);
}

static long sweep6(void *map, struct flow_key6 *key, struct flow_ent *v,
		   struct sweep_ctx *c)
{
	return sweep_one(map, (const union fkey *)key, true, v, c);
}

/* sweep exports and removes idle flows (or all of them at shutdown). Run by
 * userspace with BPF_PROG_TEST_RUN; the context is struct sweep_args. */
SEC("syscall")
int sweep(struct sweep_args *a)
{
	struct sweep_ctx c = {
		.now = a->now_ns,
		.idle = a->idle_ns,
		.reason = a->reason,
		.max = a->max_records,
	};

	bpf_for_each_map_elem(&flows4, sweep4, &c, 0);
	if (!c.deferred)
		bpf_for_each_map_elem(&flows6, sweep6, &c, 0);
	a->scanned = c.scanned;
	a->exported = c.exported;
	a->deleted = c.deleted;
	a->deferred = c.deferred;
	return 0;
}

/* Room the flush keeps in the ring for the records a merge may submit. */
#define FLUSH_RING_ROOM (16 * (sizeof(struct flow_record) + 8))

struct flush_ctx {
	__u32 start;
	__u32 slots;
	__u32 next;
	__u32 merged;
	__u32 deferred;
};

static long flush_one(__u64 i, struct flush_ctx *c)
{
	__u32 pos = c->start + (__u32)i;
	__u32 cpu = pos / c->slots;
	__u32 slot = pos % c->slots;
	__u32 one = 1;
	void *cache = bpf_map_lookup_elem(&caches, &one);

	c->next = pos;
	if (!cache)
		return 1;
	struct flow_cent *e = bpf_map_lookup_percpu_elem(cache, &slot, cpu);
	if (!e || e->kind == CENT_EMPTY)
		return 0;
	__u64 size = bpf_ringbuf_query(&records, BPF_RB_RING_SIZE);
	__u64 used = bpf_ringbuf_query(&records, BPF_RB_AVAIL_DATA);
	if (used + FLUSH_RING_ROOM > size) {
		c->deferred = 1;
		return 1;
	}
	const struct flow_key4 *k = (const struct flow_key4 *)e->key;
	struct meter *m = meter_for(k->ifindex, k->direction & 1);
	if (!m)
		return 0; /* not reached: slot 0 always exists */
	cent_merge(e, m);
	c->merged++;
	return 0;
}

/* flush merges every slot of the cache generation in caches[1] into the
 * flow tables. Run by userspace (BPF_PROG_TEST_RUN) after a flip; the
 * context is struct flush_args. */
SEC("syscall")
int flush(struct flush_args *a)
{
	struct flush_ctx c = {
		.start = a->start,
		.slots = cache_mask + 1,
	};
	__u32 end = a->end;
	__u32 n = end > c.start ? end - c.start : 0;

	c.next = c.start;
	bpf_loop(n, flush_one, &c, 0);
	a->next = c.deferred ? c.next : end;
	a->merged = c.merged;
	a->deferred = c.deferred;
	return 0;
}
