// Command native-oracle writes random native histograms with what Prometheus 3.16 computes from
// them: histogram_quantile (promql.HistogramQuantile), the sum of two (FloatHistogram.Add), the
// difference of two scrapes (FloatHistogram.DetectReset, then FloatHistogram.Sub) and a schema
// reduction (FloatHistogram.CopyToSchema). tests/native_oracle.rs compares src/exposition/native.rs
// with these answers bit for bit. Run from this folder:
//
//	GOTOOLCHAIN=local go run . > ../../../tests/data/native-oracle.json
package main

import (
	"encoding/json"
	"math"
	"math/rand"
	"os"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser/posrange"
)

// Hist is a native histogram in the shape the Rust test reads: absolute bucket counts per index.
type Hist struct {
	Schema        int32       `json:"schema"`
	ZeroThreshold float64     `json:"zeroThreshold"`
	ZeroCount     float64     `json:"zeroCount"`
	Count         float64     `json:"count"`
	Sum           float64     `json:"sum"`
	Positive      [][2]float64 `json:"positive"`
	Negative      [][2]float64 `json:"negative"`
}

type Case struct {
	A         Hist               `json:"a"`
	B         Hist               `json:"b"`
	Quantiles map[string]float64 `json:"quantiles"` // q -> histogram_quantile(q, a), as a string key
	Sum       Hist               `json:"sum"`       // a + b
	Reset     bool               `json:"reset"`     // b after a would be a counter reset
	Delta     *Hist              `json:"delta"`     // b - a when not a reset
	Reduced   Hist               `json:"reduced"`   // a in schema a.schema - 2 (at least -4)
	ReducedTo int32              `json:"reducedTo"`
}

var qs = []float64{0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1}

func buckets(spans []histogram.Span, counts []float64) [][2]float64 {
	out := [][2]float64{}
	i, k := int32(0), 0
	for n, s := range spans {
		if n == 0 {
			i = s.Offset
		} else {
			i += s.Offset
		}
		for j := uint32(0); j < s.Length; j++ {
			out = append(out, [2]float64{float64(i), counts[k]})
			i++
			k++
		}
	}
	return out
}

func of(h *histogram.FloatHistogram) Hist {
	return Hist{h.Schema, h.ZeroThreshold, h.ZeroCount, h.Count, h.Sum, buckets(h.PositiveSpans, h.PositiveBuckets), buckets(h.NegativeSpans, h.NegativeBuckets)}
}

// random spans over indices near `around`, with whole or fractional counts
func side(r *rand.Rand, around int32, whole bool) ([]histogram.Span, []float64, float64) {
	n := r.Intn(4)
	spans := []histogram.Span{}
	counts := []float64{}
	total := 0.0
	for s := 0; s < n; s++ {
		off := int32(r.Intn(5))
		if s == 0 {
			off = around + int32(r.Intn(20)) - 10
		}
		l := uint32(1 + r.Intn(6))
		spans = append(spans, histogram.Span{Offset: off, Length: l})
		for j := uint32(0); j < l; j++ {
			c := float64(r.Intn(50))
			if !whole {
				c = r.Float64() * 50
			}
			counts = append(counts, c)
			total += c
		}
	}
	return spans, counts, total
}

func random(r *rand.Rand, schema int32) *histogram.FloatHistogram {
	whole := r.Intn(3) > 0
	h := &histogram.FloatHistogram{Schema: schema}
	switch r.Intn(3) {
	case 0:
		h.ZeroThreshold = math.Ldexp(1, -128)
	case 1:
		h.ZeroThreshold = 0
	default:
		h.ZeroThreshold = 0.001
	}
	if r.Intn(2) == 0 {
		h.ZeroCount = float64(r.Intn(5))
	}
	// kube-proxy sync durations sit near 2^-8 .. 2^4 s: index ~ log2(v) * 2^schema
	around := int32(float64(r.Intn(12)-8) * math.Exp2(float64(schema)))
	var pt, nt float64
	h.PositiveSpans, h.PositiveBuckets, pt = side(r, around, whole)
	if r.Intn(4) == 0 {
		h.NegativeSpans, h.NegativeBuckets, nt = side(r, around, whole)
	}
	h.Count = h.ZeroCount + pt + nt
	h.Sum = r.Float64() * 100
	return h
}

// grown: a later scrape of the same series, b = a + new observations (or a reset, now and then)
func grown(r *rand.Rand, a *histogram.FloatHistogram) *histogram.FloatHistogram {
	schema := a.Schema
	if r.Intn(4) == 0 && schema > -4 {
		schema-- // kube-proxy restarted with another schema is a reset; a coarser one is not
	}
	more := random(r, a.Schema)
	more.ZeroThreshold = a.ZeroThreshold
	b, _, _, err := a.Copy().Add(more)
	if err != nil {
		panic(err)
	}
	if schema != b.Schema {
		var err error
		if b, err = b.CopyToSchema(schema); err != nil {
			panic(err)
		}
	}
	if r.Intn(5) == 0 {
		return random(r, a.Schema) // unrelated: usually a reset
	}
	return b
}

func main() {
	r := rand.New(rand.NewSource(20261202))
	cases := []Case{}
	for n := 0; n < 240; n++ {
		schema := int32(r.Intn(13) - 4)
		if n%3 == 0 {
			schema = 3 // kube-proxy's
		}
		a := random(r, schema)
		if a.Count == 0 {
			continue
		}
		b := grown(r, a)
		c := Case{A: of(a), B: of(b), Quantiles: map[string]float64{}}
		for _, q := range qs {
			v, _ := promql.HistogramQuantile(q, a, "m", posrange.PositionRange{})
			c.Quantiles[jsonFloat(q)] = v
		}
		sum, _, _, err := a.Copy().Add(b)
		if err != nil {
			panic(err)
		}
		c.Sum = of(sum)
		c.Reset = b.DetectReset(a)
		if !c.Reset {
			d, _, _, err := b.Copy().Sub(a)
			if err != nil {
				panic(err)
			}
			h := of(d)
			c.Delta = &h
		}
		c.ReducedTo = a.Schema - 2
		if c.ReducedTo < -4 {
			c.ReducedTo = -4
		}
		reduced, err := a.CopyToSchema(c.ReducedTo)
		if err != nil {
			panic(err)
		}
		c.Reduced = of(reduced)
		cases = append(cases, c)
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(cases); err != nil {
		panic(err)
	}
}

func jsonFloat(q float64) string {
	b, _ := json.Marshal(q)
	return string(b)
}
