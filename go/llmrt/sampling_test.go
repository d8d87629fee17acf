package llmrt

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// Per-cache parameters in one step give each cache the token a lone Sample
// with its parameters gives, and SampleLogits on the step's row (Decode), the
// cache's tokens and its length gives it too; a bad set anywhere changes nothing.
func TestSampleEach(t *testing.T) {
	ref, _ := loadReference(t)
	m := loadModel(t)
	d := DefaultSamplerParams()
	greedyBiased := d
	greedyBiased.Temperature = 0
	greedyBiased.LogitBias = []LogitBias{{Token: 7, Bias: 4}, {Token: 3, Bias: float32(math.Inf(-1))}}
	greedyBiased.FrequencyPenalty, greedyBiased.PenaltyLastN = 0.5, 8
	penalised := d
	penalised.Temperature, penalised.TopK, penalised.TopP, penalised.MinP = 1.2, 0, 1, 0
	penalised.RepetitionPenalty, penalised.PresencePenalty, penalised.Seed = 1.3, 1, 11
	sets := []SamplerParams{greedyBiased, penalised, d}
	n := len(sets)
	var batch, lone, manual []*Cache
	var hist [][]uint32
	for i := 0; i < n; i++ {
		b, l, mc := must(m.Reserve(0)), must(m.Reserve(0)), must(m.Reserve(0))
		must(b.Prefill(ref.GreedyPrompt))
		must(l.Prefill(ref.GreedyPrompt))
		must(mc.Prefill(ref.GreedyPrompt))
		batch, lone, manual = append(batch, b), append(lone, l), append(manual, mc)
		hist = append(hist, append([]uint32(nil), ref.GreedyPrompt...))
	}
	toks := []uint32{1, 2, 3}
	for step := 0; step < 12; step++ {
		got, err := m.SampleEach(batch, toks, sets)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for i := range sets {
			alone := must(m.Sample([]*Cache{lone[i]}, []uint32{toks[i]}, sets[i]))
			row := must(m.Decode([]*Cache{manual[i]}, []uint32{toks[i]}))
			hist[i] = append(hist[i], toks[i])
			fromRow := must(SampleLogits(sets[i], row[0], hist[i], uint64(len(hist[i]))))
			if got[i] != alone[0] || got[i] != fromRow {
				t.Fatalf("step %d cache %d: batched %d, alone %d, SampleLogits %d", step, i, got[i], alone[0], fromRow)
			}
		}
		if got[0] == 3 {
			t.Fatalf("step %d: drew the banned token 3", step)
		}
		toks = got
	}
	before := must(batch[0].Len())
	bad := d
	bad.LogitBias = []LogitBias{{Token: m.Info().VocabSize, Bias: 1}}
	_, err := m.SampleEach(batch, toks, []SamplerParams{d, bad, d})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "params[1]") {
		t.Errorf("bias past the vocabulary: %v", err)
	}
	bad = d
	bad.FrequencyPenalty = float32(math.NaN())
	if _, err := m.SampleEach(batch, toks, []SamplerParams{bad, d, d}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("NaN frequency penalty: %v", err)
	}
	if _, err := m.SampleEach(batch, toks, []SamplerParams{d}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("one set for three caches: %v", err)
	}
	for _, c := range batch {
		if after := must(c.Len()); after != before {
			t.Errorf("a rejected step moved a cache from %d to %d", before, after)
		}
	}
	if _, err := SampleLogits(d, nil, nil, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("SampleLogits with no logits: %v", err)
	}
}
