package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Sharding across replicas (package sharding): registered at the first report,
// so an operator without sharding shows none of them.
type shardingMetrics struct {
	built     sync.Once
	once      sync.Once
	owned     prometheus.Gauge
	members   prometheus.Gauge
	handovers *prometheus.CounterVec
	rebalance prometheus.Histogram
}

// RebalanceBuckets are the buckets of luaop_shard_rebalance_seconds: from a
// change of the members to every object with its member takes one write per
// moved object and the handovers' cycles in flight.
var RebalanceBuckets = []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60, 120, 300}

// shardCollectors makes the collectors (once), registered or not: Names lists them.
func (m *Metrics) shardCollectors() *shardingMetrics {
	s := &m.sharding
	s.built.Do(func() {
		s.owned = newGauge("luaop_shard_objects_owned", "Objects this replica handles (its share of the group).")
		s.members = newGauge("luaop_shard_members", "Live members of the shard group, as this replica sees them.")
		s.handovers = newCounterVec("luaop_shard_handovers_total",
			"Objects moved between replicas: marked (by the coordinator), released (by this replica, the old owner), reassigned (from a member gone, by the coordinator).",
			"kind")
		s.rebalance = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "luaop_shard_rebalance_seconds",
			Help: "Time from a change of the members to every object with its member (observed by the coordinator).", Buckets: RebalanceBuckets})
	})
	return s
}

func (s *shardingMetrics) all() []prometheus.Collector {
	return []prometheus.Collector{s.owned, s.members, s.handovers, s.rebalance}
}

func (m *Metrics) shard() *shardingMetrics {
	s := m.shardCollectors()
	s.once.Do(func() { m.registry.MustRegister(s.all()...) })
	return s
}

// ShardOwned records this replica's share (sharding.Observer).
func (m *Metrics) ShardOwned(objects, members int) {
	s := m.shard()
	s.owned.Set(float64(objects))
	s.members.Set(float64(members))
}

// ShardHandover counts one object moved (sharding.Observer).
func (m *Metrics) ShardHandover(kind string) { m.shard().handovers.WithLabelValues(kind).Inc() }

// ShardRebalanced records one rebalance's duration (sharding.Observer).
func (m *Metrics) ShardRebalanced(d time.Duration) { m.shard().rebalance.Observe(d.Seconds()) }
