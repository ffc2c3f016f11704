module herald.dev/libs/rv

go 1.26
