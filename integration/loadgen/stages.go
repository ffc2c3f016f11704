package loadgen

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Stage is a latency histogram one of the target's processes exports: how
// long an event took to reach a point of the pipeline (e.g. "cache applied").
// A run reads it before and after the writes and reports the quantiles of
// the difference, so that the end-to-end latency can be split by hop.
type Stage struct {
	Name string // e.g. "ingest: appended to JetStream"
	// URLs: the /metrics of the processes of the hop (replicas of one
	// service: their histograms are summed).
	URLs   []string
	Metric string // a Prometheus histogram, seconds
}

// StageLatency is one stage's latency over a run's writes.
type StageLatency struct {
	Name     string
	Count    uint64
	P50, P99 time.Duration
}

// histogram is a Prometheus histogram's cumulative buckets.
type histogram struct {
	bounds []float64 // upper bounds, ascending, +Inf last
	counts []float64
}

// readHistogram reads s's histogram from every one of its processes and
// sums them (replicas of one service have the same buckets).
func readHistogram(ctx context.Context, c *http.Client, s Stage) (histogram, error) {
	var sum histogram
	for _, u := range s.URLs {
		h, err := readOneHistogram(ctx, c, u, s.Metric)
		if err != nil {
			return histogram{}, err
		}
		if sum.bounds == nil {
			sum = h
			continue
		}
		if !slices.Equal(sum.bounds, h.bounds) {
			return histogram{}, fmt.Errorf("%s: %s has other buckets than %s", s.Metric, u, s.URLs[0])
		}
		for i := range sum.counts {
			sum.counts[i] += h.counts[i]
		}
	}
	if sum.bounds == nil {
		return histogram{}, fmt.Errorf("stage %s: no URLs", s.Name)
	}
	return sum, nil
}

// readOneHistogram reads metric from the /metrics at url.
func readOneHistogram(ctx context.Context, c *http.Client, url, metric string) (histogram, error) {
	body, err := Get(ctx, c, url, "")
	if err != nil {
		return histogram{}, err
	}
	type bucket struct{ le, n float64 }
	var bs []bucket
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, metric+"_bucket{")
		if !ok {
			continue
		}
		_, after, ok := strings.Cut(rest, `le="`)
		if !ok {
			continue
		}
		le, after, ok := strings.Cut(after, `"`)
		if !ok {
			continue
		}
		f := strings.Fields(after)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return histogram{}, fmt.Errorf("%s: %q: %w", metric, line, err)
		}
		b := math.Inf(1)
		if le != "+Inf" {
			if b, err = strconv.ParseFloat(le, 64); err != nil {
				return histogram{}, fmt.Errorf("%s: %q: %w", metric, line, err)
			}
		}
		bs = append(bs, bucket{b, n})
	}
	if len(bs) == 0 {
		return histogram{}, fmt.Errorf("%s: no histogram %s", url, metric)
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	var h histogram
	for _, b := range bs {
		h.bounds = append(h.bounds, b.le)
		h.counts = append(h.counts, b.n)
	}
	return h, nil
}

// since is h minus an earlier reading of the same histogram.
func (h histogram) since(before histogram) histogram {
	d := histogram{bounds: h.bounds, counts: make([]float64, len(h.counts))}
	for i := range h.counts {
		d.counts[i] = h.counts[i]
		if i < len(before.counts) {
			d.counts[i] -= before.counts[i]
		}
	}
	return d
}

// quantile interpolates linearly inside the bucket that holds q, as
// Prometheus' histogram_quantile does.
func (h histogram) quantile(q float64) time.Duration {
	if len(h.counts) == 0 || h.counts[len(h.counts)-1] == 0 {
		return 0
	}
	rank := q * h.counts[len(h.counts)-1]
	lower, below := 0.0, 0.0
	for i, n := range h.counts {
		if n >= rank {
			upper := h.bounds[i]
			if math.IsInf(upper, 1) {
				return time.Duration(lower * float64(time.Second))
			}
			if n == below {
				return time.Duration(upper * float64(time.Second))
			}
			v := lower + (upper-lower)*(rank-below)/(n-below)
			return time.Duration(v * float64(time.Second))
		}
		lower, below = h.bounds[i], n
	}
	return time.Duration(lower * float64(time.Second))
}
