package llmrt

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
)

const testSchema = `{
  "type": "object",
  "properties": {
    "s": {"type": "string", "pattern": "^[a-z]{1,6}$"},
    "n": {"type": "integer", "minimum": -5, "maximum": 42},
    "e": {"enum": ["red", "green", "blue"]},
    "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}
  },
  "required": ["s", "n", "e", "b"],
  "additionalProperties": false,
  "x-guidance": {"whitespace_flexible": false}
}`

// record is testSchema's object; decoding with DisallowUnknownFields and the
// checks in valid hold a completion to the schema (encoding/json and regexp are
// the references).
type record struct {
	S *string `json:"s"`
	N *int    `json:"n"`
	E *string `json:"e"`
	B []bool  `json:"b"`
}

var lowercase = regexp.MustCompile(`^[a-z]{1,6}$`)

func valid(text string) (bool, string) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	var r record
	if err := dec.Decode(&r); err != nil {
		return false, err.Error()
	}
	if dec.More() {
		return false, "trailing data"
	}
	switch {
	case r.S == nil || !lowercase.MatchString(*r.S):
		return false, "s"
	case r.N == nil || *r.N < -5 || *r.N > 42:
		return false, "n"
	case r.E == nil || (*r.E != "red" && *r.E != "green" && *r.E != "blue"):
		return false, "e"
	case r.B == nil || len(r.B) > 3:
		return false, "b"
	}
	return true, ""
}

func hot(seed uint64) SamplerParams {
	p := DefaultSamplerParams()
	p.Temperature, p.TopK, p.TopP, p.MinP, p.Seed = 1, 0, 1, 0, seed
	return p
}

// Completions under a JSON schema, four per batched step, all valid; the
// checks reject an instance outside the schema.
func TestDecodeSampleConstrained(t *testing.T) {
	m := loadModel(t)
	prompt := must(m.Tokenize("The record as JSON:", true))
	base := must(m.Reserve(0))
	must(base.Prefill(prompt[:len(prompt)-1]))
	last := prompt[len(prompt)-1]
	for round := 0; round < 4; round++ {
		var caches []*Cache
		var gs []*Grammar
		var ps []SamplerParams
		for i := 0; i < 4; i++ {
			caches = append(caches, must(base.Fork()))
			gs = append(gs, must(m.NewGrammar(GrammarJSONSchema, testSchema)))
			ps = append(ps, hot(uint64(100*round+i)))
		}
		texts := make([]bytes.Buffer, 4)
		ended := make([]bool, 4)
		toks := []uint32{last, last, last, last}
		for step := 0; step < 96; step++ {
			next, err := m.DecodeSampleConstrained(caches, toks, ps, gs)
			if err != nil {
				t.Fatalf("round %d step %d: %v", round, step, err)
			}
			for i, tok := range next {
				if ended[i] {
					continue
				}
				if m.IsEOG(tok) {
					ended[i] = true
					continue
				}
				texts[i].WriteString(must(m.TokenPiece(tok)))
			}
			toks = next
		}
		for i := range texts {
			if !ended[i] || !must(gs[i].IsDone()) {
				t.Fatalf("round %d request %d did not finish: %q", round, i, texts[i].String())
			}
			if ok, why := valid(texts[i].String()); !ok {
				t.Errorf("round %d request %d: %q is not valid (%s)", round, i, texts[i].String(), why)
			}
			gs[i].Free()
			gs[i].Free()
		}
	}
	if ok, _ := valid(`{"s":"abc","n":43,"e":"red","b":[]}`); ok {
		t.Error("the checks accept n = 43")
	}
}

func TestGrammarErrors(t *testing.T) {
	m := loadModel(t)
	_, err := m.NewGrammar(GrammarJSONSchema, `{"type": "integer", "minimum": 3, "maximum": 1}`)
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "Unsatisfiable") {
		t.Errorf("unsatisfiable schema: %v", err)
	}
	if _, err := m.NewGrammar(GrammarRegex, "(ab"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad regex: %v", err)
	}
	if _, err := m.NewGrammar(GrammarKind(9), "a"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad kind: %v", err)
	}
	g := must(m.NewGrammar(GrammarRegex, "[0-9]{2}"))
	defer g.Free()
	if err := g.Accept(m.Info().EOSToken); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("EOS before anything: %v", err)
	}
	a, b := must(m.Reserve(0)), must(m.Reserve(0))
	must(a.Prefill([]uint32{1, 2}))
	must(b.Prefill([]uint32{1, 2}))
	p := hot(1)
	_, err = m.DecodeSampleConstrained([]*Cache{a, b}, []uint32{3, 3}, []SamplerParams{p, p}, []*Grammar{g, g})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "grammars[1]") {
		t.Errorf("one grammar twice: %v", err)
	}
	if must(a.Len()) != 2 || must(b.Len()) != 2 {
		t.Error("a rejected step moved a cache")
	}
	// nil entries are unconstrained; the caller-held variant draws the step's token.
	c := must(m.Reserve(0))
	must(c.Prefill([]uint32{1, 2}))
	twin := must(m.NewGrammar(GrammarRegex, "[0-9]{2}"))
	defer twin.Free()
	got := must(m.DecodeSampleConstrained([]*Cache{a, b}, []uint32{3, 3}, []SamplerParams{p, p}, []*Grammar{g, nil}))
	row := must(m.Decode([]*Cache{c}, []uint32{3}))
	host := must(SampleLogitsConstrained(p, twin, row[0], []uint32{1, 2, 3}, 3))
	if host != got[0] {
		t.Errorf("SampleLogitsConstrained %d, step %d", host, got[0])
	}
	if err := twin.Accept(host); err != nil {
		t.Error(err)
	}
	g.Free()
	if _, err := g.IsDone(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("freed grammar: %v", err)
	}
}
