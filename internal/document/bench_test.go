package document

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/task"
)

// benchNotes is the size of the corpus the speed target names.
const benchNotes = 100_000

// benchWords is a vocabulary of made-up words; notes draw from it with a
// Zipf distribution, as words in real notes are, so some words are in most
// notes and most words in few.
func benchWords(n int) []string {
	syl := []string{"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "pe", "da", "gu", "ho", "ji", "be", "fa", "zo"}
	words := make([]string, n)
	for i := range words {
		var b strings.Builder
		for x := i + 16; x > 0; x /= 16 {
			b.WriteString(syl[x%16])
		}
		words[i] = b.String()
	}
	return words
}

// BenchmarkSearch100k searches 100k indexed notes of about 80 words each,
// for two words of middling frequency (each in ~1% of notes) and for one
// common word (in ~20%), with FTS5 and BM25 ranking; and for comparison the
// nearest thing without an index, a LIKE scan of the same text (unranked,
// first 20 matches). Each reports the median latency as median-ms.
func BenchmarkSearch100k(b *testing.B) {
	e := MustOpen(b, b.TempDir())
	ctx := context.Background()
	words := benchWords(5000)
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rand.New(rand.NewPCG(3, 4)), 1.07, 2, uint64(len(words)-1))
	w := e.db.Write
	if _, err := w.ExecContext(ctx, `CREATE TABLE bench_notes (title TEXT, body TEXT)`); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	batch := make([]row, 0, 1000)
	for i := range benchNotes {
		n := 60 + rng.IntN(40)
		text := make([]string, n)
		for j := range text {
			text[j] = words[zipf.Uint64()]
		}
		id := NewID()
		r := row{doc: Doc{DocumentIngested: task.DocumentIngested{DocumentID: id, Title: strings.Join(text[:4], " "), SourceType: SourceNote, File: id + "_n.md"}, Indexed: true},
			text: strings.Join(text, " ")}
		batch = append(batch, r)
		if len(batch) == cap(batch) || i == benchNotes-1 {
			if err := e.ix.put(ctx, batch, 0); err != nil {
				b.Fatal(err)
			}
			tx, err := w.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range batch {
				if _, err := tx.ExecContext(ctx, `INSERT INTO bench_notes VALUES (?, ?)`, r.doc.Title, r.text); err != nil {
					b.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	b.Logf("indexed %d notes in %s", benchNotes, time.Since(start).Round(time.Millisecond))

	// Pick words by how many notes hold them.
	df := func(w string) int {
		var n int
		e.db.Read.QueryRowContext(ctx, `SELECT count(*) FROM docindex_fts WHERE docindex_fts MATCH ?`, `"`+w+`"`).Scan(&n)
		return n
	}
	pick := func(lo, hi int) string {
		for _, w := range words[2:] {
			if n := df(w); n >= lo && n <= hi {
				return w
			}
		}
		b.Fatalf("no word in %d..%d notes", lo, hi)
		return ""
	}
	rare1, common := pick(800, 1200), pick(15000, 25000)
	var rare2 string
	for _, w := range words[2:] {
		if n := df(w); n >= 800 && n <= 1200 && w != rare1 {
			rare2 = w
			break
		}
	}
	b.Logf("query words: %s (%d notes), %s (%d), common %s (%d)", rare1, df(rare1), rare2, df(rare2), common, df(common))

	median := func(b *testing.B, f func() int) {
		durs := make([]time.Duration, 0, b.N)
		var hits int
		for b.Loop() {
			t0 := time.Now()
			hits = f()
			durs = append(durs, time.Since(t0))
		}
		slices.Sort(durs)
		b.ReportMetric(float64(durs[len(durs)/2].Microseconds())/1000, "median-ms")
		b.ReportMetric(float64(hits), "hits")
	}
	fts := func(q string) func() int {
		return func() int {
			hits, err := e.ix.Search(ctx, Query{Text: q, Kind: KindNote})
			if err != nil {
				b.Fatal(err)
			}
			return len(hits)
		}
	}
	like := func(ws ...string) func() int {
		return func() int {
			var conds []string
			var args []any
			for _, w := range ws {
				conds = append(conds, "title LIKE ? OR body LIKE ?")
				args = append(args, "%"+w+"%", "%"+w+"%")
			}
			rows, err := e.db.Read.QueryContext(ctx, `SELECT title, substr(body, 1, 200) FROM bench_notes WHERE `+strings.Join(conds, " OR ")+` LIMIT 20`, args...)
			if err != nil {
				b.Fatal(err)
			}
			defer rows.Close()
			n := 0
			for rows.Next() {
				n++
			}
			return n
		}
	}
	b.Run("fts5/two-words", func(b *testing.B) { median(b, fts(rare1+" "+rare2)) })
	b.Run("fts5/common-word", func(b *testing.B) { median(b, fts(common)) })
	b.Run("like/two-words", func(b *testing.B) { median(b, like(rare1, rare2)) })
	b.Run("like/absent-word", func(b *testing.B) { median(b, like("zzzqqq")) })
	b.Run("fts5/absent-word", func(b *testing.B) { median(b, fts("zzzqqq")) })
}
