module github.com/llmrt/llmrt/go

go 1.19
