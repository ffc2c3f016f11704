package conformance

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// Result is one test's outcome in one run.
type Result struct {
	// State is ginkgo's: passed, failed, skipped, panicked, timedout,
	// interrupted, aborted, pending; "not run" if the run has no such test.
	State   string
	RunTime time.Duration
	// Message is the failure's (or the skip's) message, first line.
	Message string
}

// Passed reports whether the test passed.
func (r Result) Passed() bool { return r.State == "passed" }

// Report is one run's results by test name.
type Report struct {
	Results map[string]Result
	// SuiteFailure is set when a suite-level node (the framework's
	// BeforeSuite, for example) failed: then no test ran.
	SuiteFailure string
}

// ginkgoReport is the part of ginkgo's JSON report (types.Report,
// -ginkgo.json-report) this package reads.
type ginkgoReport struct {
	SpecReports []struct {
		ContainerHierarchyTexts []string
		LeafNodeType            string
		LeafNodeText            string
		State                   string
		RunTime                 time.Duration
		Failure                 struct{ Message string }
	}
}

// ReadReport reads a ginkgo JSON report file.
func ReadReport(path string) (Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Report{}, err
	}
	return ParseReport(b)
}

// ParseReport parses a ginkgo JSON report: one report per suite run.
func ParseReport(b []byte) (Report, error) {
	var reports []ginkgoReport
	if err := json.Unmarshal(b, &reports); err != nil {
		return Report{}, fmt.Errorf("ginkgo JSON report: %w", err)
	}
	run := Report{Results: map[string]Result{}}
	for _, r := range reports {
		for _, s := range r.SpecReports {
			msg := firstLine(s.Failure.Message)
			if s.LeafNodeType != "It" {
				// Suite-level nodes: only their failures matter.
				if s.State != "passed" && s.State != "skipped" && run.SuiteFailure == "" {
					run.SuiteFailure = fmt.Sprintf("%s %s: %s", s.LeafNodeType, s.State, msg)
				}
				continue
			}
			// A spec that the focus and skip expressions leave out is
			// reported as skipped with no message: not part of the run.
			if s.State == "skipped" && msg == "" {
				continue
			}
			name := strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " ")
			run.Results[name] = Result{State: s.State, RunTime: s.RunTime, Message: msg}
		}
	}
	return run, nil
}

// firstLine is a failure message on one line (gomega's span several:
// "Expected\n    <int>: 440\nto be ==\n    <int>: 400"), shortened.
func firstLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	const max = 300
	if len(s) > max {
		s = s[:max] + "..."
	}
	return s
}

// Row is one test of the comparison.
type Row struct {
	Test            string
	Baseline, Under Result
}

// Differs reports whether the row is a difference that fails the run: the
// baseline passed and the server under test did not.
func (r Row) Differs() bool { return r.Baseline.Passed() && !r.Under.Passed() }

// Comparison is the baseline's run and the run through the server under
// test, test by test.
type Comparison struct {
	Rows                  []Row
	BaselineSuiteFailure  string
	UnderSuiteFailure     string
	BaselinePassed        int
	UnderPassedOfBaseline int // tests both passed
}

// Compare lines up two runs by test name (sorted).
func Compare(baseline, under Report) Comparison {
	names := map[string]bool{}
	for n := range baseline.Results {
		names[n] = true
	}
	for n := range under.Results {
		names[n] = true
	}
	c := Comparison{BaselineSuiteFailure: baseline.SuiteFailure, UnderSuiteFailure: under.SuiteFailure}
	for n := range names {
		row := Row{Test: n, Baseline: baseline.result(n), Under: under.result(n)}
		if row.Baseline.Passed() {
			c.BaselinePassed++
			if row.Under.Passed() {
				c.UnderPassedOfBaseline++
			}
		}
		c.Rows = append(c.Rows, row)
	}
	sort.Slice(c.Rows, func(i, j int) bool { return c.Rows[i].Test < c.Rows[j].Test })
	return c
}

func (r Report) result(name string) Result {
	if res, ok := r.Results[name]; ok {
		return res
	}
	return Result{State: "not run"}
}

// Differences are the rows that fail the comparison.
func (c Comparison) Differences() []Row {
	var out []Row
	for _, r := range c.Rows {
		if r.Differs() {
			out = append(out, r)
		}
	}
	return out
}

// Err is nil when the server under test passed every test the baseline
// passed and the baseline passed at least one.
func (c Comparison) Err() error {
	switch {
	case c.BaselinePassed == 0:
		msg := "kube-apiserver passed no test: the baseline is broken, nothing was compared"
		if c.BaselineSuiteFailure != "" {
			msg += " (" + c.BaselineSuiteFailure + ")"
		}
		return fmt.Errorf("%s", msg)
	case len(c.Differences()) > 0:
		return fmt.Errorf("Herald failed %d of the %d tests kube-apiserver passed", len(c.Differences()), c.BaselinePassed)
	}
	return nil
}

// WriteTable prints the comparison: one line per test with each side's
// state and run time, the differences marked, then each difference's
// failure message and a summary.
func (c Comparison) WriteTable(w io.Writer, baselineName, underName string) {
	width := len("TEST")
	for _, r := range c.Rows {
		width = max(width, len(r.Test))
	}
	cell := func(r Result) string {
		if r.State == "not run" {
			return r.State
		}
		return fmt.Sprintf("%s %s", r.State, r.RunTime.Round(100*time.Millisecond))
	}
	fmt.Fprintf(w, "  %-*s  %-20s  %s\n", width, "TEST", baselineName, underName)
	for _, r := range c.Rows {
		mark := " "
		if r.Differs() {
			mark = "!"
		}
		fmt.Fprintf(w, "%s %-*s  %-20s  %s\n", mark, width, r.Test, cell(r.Baseline), cell(r.Under))
	}
	for _, f := range []struct{ name, msg string }{{baselineName, c.BaselineSuiteFailure}, {underName, c.UnderSuiteFailure}} {
		if f.msg != "" {
			fmt.Fprintf(w, "%s: the suite failed before its tests: %s\n", f.name, f.msg)
		}
	}
	for _, r := range c.Differences() {
		fmt.Fprintf(w, "! %s\n    %s: %s\n    %s: %s\n", r.Test, baselineName, r.Baseline.State, underName, r.Under.State+": "+r.Under.Message)
	}
	fmt.Fprintf(w, "%d tests; %s passed %d; %s passed %d of those; differences: %d\n",
		len(c.Rows), baselineName, c.BaselinePassed, underName, c.UnderPassedOfBaseline, len(c.Differences()))
}
